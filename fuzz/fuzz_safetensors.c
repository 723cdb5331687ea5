/*
 * fuzz/fuzz_safetensors.c — libFuzzer harness for Hugging Face checkpoints:
 * a folder of config.json and model.safetensors, read by
 * gptc/safetensors.h's hf_checkpoint_read (--model DIR, --convert).
 *
 *   make fuzz/.build/fuzz_safetensors    (or make fuzz, make test-fuzz)
 *
 * The input holds both files: a little-endian uint16 k, k bytes of
 * config.json, then model.safetensors (fuzz_split2). Oracles for a
 * checkpoint that reads: every weight finite, the pad rows of wte zero;
 * written back by hf_checkpoint_write and read again (ours -> HF -> ours),
 * the same config and weights bit for bit.
 *
 * And what the format requires: the header read alone agrees, opens with
 * '{', and its tensors fill the data buffer in order, without holes or
 * bytes after.
 */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz_init("safetensors");
    const uint8_t *cfg, *st;
    size_t ncfg, nst;
    fuzz_split2(data, size, &cfg, &ncfg, &st, &nst);
    static char dir[600];
    if (!dir[0]) {
        snprintf(dir, sizeof(dir), "%s", fuzz_path("ckpt"));
        mkdir(dir, 0700);
    }
    char cfg_path[700], st_path[700];
    snprintf(cfg_path, sizeof(cfg_path), "%s/config.json", dir);
    snprintf(st_path, sizeof(st_path), "%s/model.safetensors", dir);
    FILE* f = fopen(cfg_path, "wb");
    FUZZ_ORACLE(f && fwrite(cfg, 1, ncfg, f) == ncfg && fclose(f) == 0, "cannot write %s", cfg_path);
    f = fopen(st_path, "wb");
    FUZZ_ORACLE(f && fwrite(st, 1, nst, f) == nst && fclose(f) == 0, "cannot write %s", st_path);
    GPT2Config c;
    float* params = NULL;
    if (hf_checkpoint_read(dir, &c, &params) != 0) {
        FUZZ_ORACLE(params == NULL, "a refused checkpoint left a buffer behind");
        return fuzz_refused();
    }
    size_t n = parameter_count(&c);
    for (size_t i = 0; i < n; i++) FUZZ_ORACLE(isfinite(params[i]), "weight %zu is not finite", i);
    for (size_t i = (size_t)c.vocab_size * c.channels; i < (size_t)c.padded_vocab_size * c.channels; i++)
        FUZZ_ORACLE(params[i] == 0.0f, "pad row weight %zu is not zero", i);
    {
        FILE* g = fopen(st_path, "rb");
        StHeader h;
        FUZZ_ORACLE(g && st_header_read(g, st_path, (long long)nst, &h) == 0, "the header read once, not twice");
        fclose(g);
        FUZZ_ORACLE(nst > 8 && st[8] == '{', "the header does not open with '{'");
        SafeTensor** order = (SafeTensor**)malloc(sizeof(SafeTensor*) * (size_t)(h.n ? h.n : 1));
        for (int i = 0; i < h.n; i++) order[i] = &h.t[i];
        qsort(order, (size_t)h.n, sizeof(SafeTensor*), st_by_begin);
        unsigned long long at = 0;
        for (int i = 0; i < h.n; i++) {
            FUZZ_ORACLE(order[i]->begin == at, "tensor %s begins at %llu, the one before ends at %llu", order[i]->name,
                        order[i]->begin, at);
            at = order[i]->end;
        }
        FUZZ_ORACLE(at == (unsigned long long)h.data_bytes, "the tensors end at %llu, the file's buffer at %lld", at,
                    h.data_bytes);
        free(order);
        free(h.t);
    }
    char out[700];
    snprintf(out, sizeof(out), "%s", fuzz_path("again"));
    FUZZ_ORACLE(hf_checkpoint_write(out, &c, params) == 0, "cannot write back what was read");
    fuzz_reads_back(hf_checkpoint_read, out, &c, params, n, "ours -> HF -> ours");
    free(params);
    return 0;
}
