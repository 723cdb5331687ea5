#!/usr/bin/env node
// tokenizer_reference.js — runs the reference GPT-2 tokenizer (Encoder.js from
// the npm package gpt-3-encoder, fetched by scripts/fetch_tokenizer.sh) to make
// the expected token ids our C tokenizer is tested against.
//
//   node scripts/tokenizer_reference.js fixture [cases.txt] [out.bin]
//        parse the hand-written cases, add the deterministic ~1 MB of mixed
//        documents, tokenize all of them, write the fixture (defaults:
//        dev/fixtures/tokenizer/cases.txt -> dev/fixtures/tokenizer/expected.bin)
//   node scripts/tokenizer_reference.js encode in.bin out.bin
//        fill in the ids of every case of a fixture-format file (used by
//        test_tokenizer --live for random byte strings)
//   node scripts/tokenizer_reference.js bench [expected.bin]
//        MB/s of the reference on the mixed documents (bench_tokenizer.sh)
// Environment: TOKENIZER_DIR (default data/tokenizer) holds gpt-3-encoder/.
//
// ---- what "the reference" means for any byte string ----
// The reference tokenizes a JS string: regex pre-tokens, each pre-token
// UTF-8-encoded, mapped through GPT-2's byte table, BPE'd. For bytes that are
// valid UTF-8 we decode them (no BOM stripping) and call the reference's own
// exported encode(): the ids are the reference's, full stop.
// Invalid UTF-8 has no JS string, so we extend the reference the way Python's
// "surrogateescape" does: each byte that does not start a valid UTF-8
// sequence becomes the lone surrogate U+DC00+byte. The reference's own regex
// then treats it as it treats any lone surrogate: neither letter, number nor
// white space (the [^\s\p{L}\p{N}] class). Each pre-token is turned back into
// the original bytes (instead of TextEncoder, which would write U+FFFD), and
// the reference's own bpe() and vocabulary finish the job. So every byte
// string has one tokenization, decode(encode(x)) == x always, and valid text
// is untouched. Valid = RFC 3629: shortest form, no surrogates, <= U+10FFFF.
//
// ---- fixture format (expected.bin) ----
//   header 256 int32 LE: [0] 20261103 magic, [1] 1 version, [2] number of cases
//   per case: int32 kind (0 valid UTF-8 case, 1 case with invalid UTF-8 (the
//   extension above), 2 mixed document), int32 line in cases.txt (0 if none),
//   then for kinds 0 and 1: uint32 number of bytes, the bytes;
//   for kind 2 (to keep the fixture small): uint32 number of parts P, then P
//   uint16 indices of earlier kind-0 cases whose bytes, concatenated, are the
//   document's bytes;
//   then uint32 number of ids, the ids as uint16 LE.
// The mixed documents are ~1 MB of text made deterministically (xorshift32)
// from the valid cases (3 in 4 parts from the ASCII-only ones, so the mix is
// closer to web text) joined by separators, which are cases too (line 0).
'use strict';
const fs = require('fs');
const path = require('path');

const FIXTURE_MAGIC = 20261103, FIXTURE_VERSION = 1;
const KIND_VALID = 0, KIND_INVALID = 1, KIND_DOC = 2;
const root = path.join(__dirname, '..');
const tokDir = process.env.TOKENIZER_DIR || path.join(root, 'data', 'tokenizer');

function die(msg) { console.error(`tokenizer_reference: error: ${msg}`); process.exit(1); }

// ---- load the reference, exposing its internals (bpe, byte_encoder, ...) ----
function loadReference() {
  const pkg = path.join(tokDir, 'gpt-3-encoder');
  const file = path.join(pkg, 'Encoder.js');
  if (!fs.existsSync(file)) die(`${file} not found; run scripts/fetch_tokenizer.sh first`);
  const src = fs.readFileSync(file, 'utf8') +
    '\nmodule.exports.internals = { bpe, byte_encoder, encoder, pat };\n';
  const mod = { exports: {} };
  new Function('require', 'module', 'exports', '__dirname', '__filename', src)(require, mod, mod.exports, pkg, file);
  return mod.exports;
}

// ---- UTF-8 with surrogate escapes ----
// Length of the valid UTF-8 sequence starting at b[i], or 0 if none.
function utf8Len(b, i) {
  const c = b[i], n = b.length - i;
  const cont = k => k < n && (b[i + k] & 0xc0) === 0x80;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) return cont(1) ? 2 : 0;
  if (c >= 0xe0 && c <= 0xef) {
    if (!cont(1) || !cont(2)) return 0;
    if (c === 0xe0 && b[i + 1] < 0xa0) return 0;   // overlong
    if (c === 0xed && b[i + 1] > 0x9f) return 0;   // surrogates
    return 3;
  }
  if (c >= 0xf0 && c <= 0xf4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if (c === 0xf0 && b[i + 1] < 0x90) return 0;   // overlong
    if (c === 0xf4 && b[i + 1] > 0x8f) return 0;   // > U+10FFFF
    return 4;
  }
  return 0;
}
function isValidUtf8(b) { for (let i = 0; i < b.length;) { const n = utf8Len(b, i); if (!n) return false; i += n; } return true; }
function decodeEscaped(b) {
  let s = '';
  for (let i = 0; i < b.length;) {
    const n = utf8Len(b, i);
    if (n) { s += b.subarray(i, i + n).toString('utf8'); i += n; }
    else { s += String.fromCharCode(0xdc00 + b[i]); i += 1; }
  }
  return s;
}
function encodeEscaped(s) {
  const parts = [];
  for (const ch of s) {
    const cp = ch.codePointAt(0);
    if (cp >= 0xdc80 && cp <= 0xdcff) parts.push(Buffer.from([cp - 0xdc00]));
    else parts.push(Buffer.from(ch, 'utf8'));
  }
  return Buffer.concat(parts);
}

function makeEncoder(ref) {
  const { bpe, byte_encoder, encoder, pat } = ref.internals;
  return function encodeBytes(b) {
    if (isValidUtf8(b)) return { kind: KIND_VALID, ids: ref.encode(b.toString('utf8')) };
    const ids = [];
    for (const m of decodeEscaped(b).matchAll(pat)) {
      const piece = Array.from(encodeEscaped(m[0]), x => byte_encoder[x]).join('');
      for (const t of bpe(piece).split(' ')) ids.push(encoder[t]);
    }
    return { kind: KIND_INVALID, ids };
  };
}

// ---- cases.txt: one case per line; '#' lines and empty lines skipped ----
// Escapes: \n \r \t \\ \xHH (one raw byte, may be invalid UTF-8),
// \u{H..H} (a code point, UTF-8 encoded), \s (a space, for visible edges).
function parseCases(file) {
  const out = [];
  fs.readFileSync(file, 'utf8').split('\n').forEach((line, i) => {
    if (line === '' || line.startsWith('#')) return;
    const bytes = [];
    for (let k = 0; k < line.length;) {
      const cp = line.codePointAt(k);
      if (line[k] !== '\\') { bytes.push(...Buffer.from(String.fromCodePoint(cp), 'utf8')); k += cp > 0xffff ? 2 : 1; continue; }
      const e = line[k + 1];
      const simple = { n: 10, r: 13, t: 9, '\\': 92, s: 32 }[e];
      if (simple !== undefined) { bytes.push(simple); k += 2; }
      else if (e === 'x' && /^[0-9a-fA-F]{2}$/.test(line.substr(k + 2, 2))) { bytes.push(parseInt(line.substr(k + 2, 2), 16)); k += 4; }
      else if (e === 'u' && line[k + 2] === '{') {
        const end = line.indexOf('}', k);
        const v = parseInt(line.slice(k + 3, end), 16);
        if (end < 0 || !(v >= 0 && v <= 0x10ffff)) die(`${file}:${i + 1}: bad \\u{...}`);
        // lone surrogates cannot be UTF-8 encoded; write them as raw bytes ED xx xx
        if (v >= 0xd800 && v <= 0xdfff) bytes.push(0xed, 0x80 | ((v >> 6) & 0x3f), 0x80 | (v & 0x3f));
        else bytes.push(...Buffer.from(String.fromCodePoint(v), 'utf8'));
        k = end + 1;
      } else die(`${file}:${i + 1}: unknown escape \\${e}`);
    }
    out.push({ line: i + 1, bytes: Buffer.from(bytes) });
  });
  return out;
}

// ---- the ~1 MB of mixed documents, made deterministically from the cases ----
function mixedDocs(cases, totalBytes) {
  let s = 0x2545f491;                                   // xorshift32 seed
  const rnd = n => { s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0; return s % n; };
  const valid = [], ascii = [], seps = [];
  cases.forEach((c, i) => {
    if (c.sep) seps.push(i);
    else if (isValidUtf8(c.bytes)) (c.bytes.every(b => b < 0x80) ? ascii : valid).push(i);
  });
  const docs = [];
  let total = 0;
  while (total < totalBytes) {
    const target = 64 + rnd(900);
    const parts = [];
    let len = 0;
    while (len < target) {
      const pool = rnd(4) < 3 ? ascii : valid;
      const p = pool[rnd(pool.length)], q = seps[rnd(seps.length)];
      parts.push(p, q); len += cases[p].bytes.length + cases[q].bytes.length;
    }
    docs.push(parts); total += len;
  }
  return docs;
}
const SEPARATORS = [' ', ' ', ' ', '\n', '\n\n', '', '. ', ', ', '\t', '  ', '\r\n'];

function writeFixture(file, items) {
  const chunks = [];
  const h = Buffer.alloc(1024);
  h.writeInt32LE(FIXTURE_MAGIC, 0); h.writeInt32LE(FIXTURE_VERSION, 4); h.writeInt32LE(items.length, 8);
  chunks.push(h);
  for (const it of items) {
    let a;
    if (it.kind === KIND_DOC) {
      a = Buffer.alloc(12 + 2 * it.parts.length);
      a.writeInt32LE(it.kind, 0); a.writeInt32LE(it.line, 4); a.writeUInt32LE(it.parts.length, 8);
      it.parts.forEach((p, i) => a.writeUInt16LE(p, 12 + 2 * i));
    } else {
      a = Buffer.concat([Buffer.alloc(12), it.bytes]);
      a.writeInt32LE(it.kind, 0); a.writeInt32LE(it.line, 4); a.writeUInt32LE(it.bytes.length, 8);
    }
    const ids = Buffer.alloc(4 + 2 * it.ids.length);
    ids.writeUInt32LE(it.ids.length, 0);
    it.ids.forEach((v, i) => {
      if (!Number.isInteger(v) || v < 0 || v > 65535) die(`reference produced id ${v} (line ${it.line})`);
      ids.writeUInt16LE(v, 4 + 2 * i);
    });
    chunks.push(a, ids);
  }
  fs.writeFileSync(file + '.tmp', Buffer.concat(chunks));
  fs.renameSync(file + '.tmp', file);
}
function readFixture(file) {
  const b = fs.readFileSync(file);
  if (b.readInt32LE(0) !== FIXTURE_MAGIC || b.readInt32LE(4) !== FIXTURE_VERSION) die(`${file}: not a fixture file (magic/version)`);
  const n = b.readInt32LE(8), items = [];
  let o = 1024;
  for (let i = 0; i < n; i++) {
    const kind = b.readInt32LE(o), line = b.readInt32LE(o + 4), n2 = b.readUInt32LE(o + 8);
    let bytes, parts;
    if (kind === KIND_DOC) {
      parts = []; for (let k = 0; k < n2; k++) parts.push(b.readUInt16LE(o + 12 + 2 * k));
      bytes = Buffer.concat(parts.map(p => items[p].bytes)); o += 12 + 2 * n2;
    } else { bytes = b.subarray(o + 12, o + 12 + n2); o += 12 + n2; }
    const ni = b.readUInt32LE(o); o += 4 + 2 * ni;
    items.push({ kind, line, bytes, parts });
  }
  return items;
}

// Check that our byte table (scripts/tokenizer_files.js) is the reference's.
function checkByteTable(ref) {
  const { byte_encoder, encoder } = ref.internals;
  const dec = path.join(tokDir, 'gpt2_tokenizer.bin');
  if (!fs.existsSync(dec)) return;
  const b = fs.readFileSync(dec);
  const n = b.readInt32LE(8);
  const offs = [];
  for (let id = 0, o = 1024; id < n; id++) { offs.push(o); o += 1 + b[o]; }
  for (let x = 0; x < 256; x++) {
    const o = offs[encoder[byte_encoder[x]]];
    if (b[o] !== 1 || b[o + 1] !== x) die(`gpt2_tokenizer.bin disagrees with the reference's byte table at byte ${x}`);
  }
}

const [mode, a1, a2] = process.argv.slice(2);
const ref = loadReference();
const encodeBytes = makeEncoder(ref);
if (mode === 'fixture') {
  const casesFile = a1 || path.join(root, 'dev', 'fixtures', 'tokenizer', 'cases.txt');
  const out = a2 || path.join(root, 'dev', 'fixtures', 'tokenizer', 'expected.bin');
  checkByteTable(ref);
  const cases = parseCases(casesFile);
  for (const sep of SEPARATORS) cases.push({ line: 0, bytes: Buffer.from(sep), sep: true });
  if (cases.length > 65535) die('too many cases for uint16 part indices');
  const items = cases.map(c => ({ line: c.line, bytes: c.bytes, ...encodeBytes(c.bytes) }));
  for (const parts of mixedDocs(cases, +(process.env.MIXED_BYTES || 1000000))) {
    const bytes = Buffer.concat(parts.map(p => cases[p].bytes));
    items.push({ kind: KIND_DOC, line: 0, parts, bytes, ids: encodeBytes(bytes).ids });
  }
  writeFixture(out, items);
  const nb = items.reduce((s, it) => s + it.bytes.length, 0), ni = items.reduce((s, it) => s + it.ids.length, 0);
  console.log(`tokenizer_reference: ${cases.length} cases (${items.filter(i => i.kind === KIND_INVALID).length} with invalid UTF-8) + ${items.length - cases.length} mixed documents, ${nb} bytes -> ${ni} ids; wrote ${out}`);
} else if (mode === 'encode') {
  if (!a1 || !a2) die('usage: tokenizer_reference.js encode in.bin out.bin');
  const items = readFixture(a1).map(it => { const r = encodeBytes(it.bytes); return { line: it.line, bytes: it.bytes, parts: it.parts, ids: r.ids, kind: it.kind === KIND_DOC ? KIND_DOC : r.kind }; });
  writeFixture(a2, items);
} else if (mode === 'bench') {
  const file = a1 || path.join(root, 'dev', 'fixtures', 'tokenizer', 'expected.bin');
  const docs = readFixture(file).filter(it => it.kind === KIND_DOC).map(it => it.bytes.toString('utf8'));
  const bytes = docs.reduce((s, d) => s + Buffer.byteLength(d), 0);
  for (const pass of ['cold', 'warm']) {
    const t0 = process.hrtime.bigint();
    let n = 0;
    for (const d of docs) n += ref.encode(d).length;
    const sec = Number(process.hrtime.bigint() - t0) / 1e9;
    console.log(`reference JS (node ${process.version}) ${pass} cache: ${bytes} bytes, ${n} tokens, ${sec.toFixed(3)} s, ${(bytes / sec / 1e6).toFixed(3)} MB/s`);
  }
} else {
  die('usage: tokenizer_reference.js fixture [cases.txt] [out.bin] | encode in.bin out.bin | bench [expected.bin]');
}
