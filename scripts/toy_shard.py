#!/usr/bin/env python3
"""Write a toy llm.c token shard with a learnable pattern, for smoke runs.

    /usr/bin/python3 scripts/toy_shard.py data/toy_train.bin 200000 [vocab] [seed]

Each "document" starts with the end-of-text token (vocab - 1), then counts up
from a random start modulo 100 (tokens 0..99), with a random token inserted
now and then. A model that learns the counting rule drives its loss far below
the uniform ln(vocab); a model that learns nothing stays near it.

Shard format (llm.c): 256 little-endian int32 header [20240520, 1, n, 0...],
then n uint16 tokens.
"""
import random
import struct
import sys


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    path, n = sys.argv[1], int(sys.argv[2])
    vocab = int(sys.argv[3]) if len(sys.argv) > 3 else 50257
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    if not 101 < vocab <= 65536:
        sys.exit("error: vocab must be in 102..65536 (tokens are uint16)")
    rng = random.Random(seed)
    eot = vocab - 1
    toks = []
    while len(toks) < n:
        toks.append(eot)
        x = rng.randrange(100)
        for _ in range(rng.randrange(20, 200)):
            toks.append(rng.randrange(vocab - 1) if rng.random() < 0.05 else x)
            x = (x + 1) % 100
    toks = toks[:n]
    header = struct.pack("<256i", 20240520, 1, n, *([0] * 253))
    with open(path, "wb") as f:
        f.write(header)
        f.write(struct.pack("<%dH" % n, *toks))
    print("wrote %s: %d tokens" % (path, n))


if __name__ == "__main__":
    main()
