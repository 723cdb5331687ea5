#!/usr/bin/env node
// tokenizer_files.js — turns GPT-2's encoder.json + vocab.bpe into the two
// binary files the C tokenizer (gptc/tokenizer.h) reads, then reads
// them back and checks every token and every merge against the JSON.
//
//   node scripts/tokenizer_files.js [dir]     (default data/tokenizer; run
//                                              scripts/fetch_tokenizer.sh first)
// writes [dir]/gpt2_tokenizer.bin and [dir]/gpt2_merges.bin; exits non-zero on
// any mismatch. No dependencies beyond node itself.
//
// ---- gpt2_tokenizer.bin: decode table, same format as llm.c ----
//   header: 256 little-endian int32 (1024 bytes)
//     [0] 20240328 magic   [1] 2 version   [2] number of tokens N (50257)
//     [3] end-of-text token id (50256)     [4..255] 0
//   then for id = 0 .. N-1: uint8 length L (1..255), then L raw bytes: the
//   token's string mapped back through GPT-2's bytes<->unicode table (the
//   printable stand-ins such as 'Ġ' for ' ' become the bytes they stand for).
//
// ---- gpt2_merges.bin: BPE merges, our own format ----
//   header: 256 little-endian int32 (1024 bytes)
//     [0] 20261102 magic   [1] 1 version   [2] number of tokens N (must match
//     the decode file)     [3] number of merges M (50000)
//     [4] end-of-text token id            [5] number of alias pairs A (11)
//     [6..255] 0
//   then M merges in rank order (rank = index, 0 merges first), each three
//   int32: left token id, right token id, merged token id; the merged token's
//   bytes are left's bytes followed by right's bytes.
//   then A alias pairs, each four int32: left id, right id, merged id, rank.
//   File size is exactly 1024 + 12*M + 16*A bytes.
//
// Why alias pairs: the reference JS tokenizer keys its rank table by the
// string left + "," + right, so a pair such as ('",', '"') gets the rank of
// the real merge ('"', ',"') (both read '",,"') and is merged like it. The
// tokens it makes are the same strings (the two joins are equal), so we list
// these pairs with the rank they borrow; the C encoder treats them exactly as
// the reference does. For GPT-2's files there are 11 of them.
'use strict';
const fs = require('fs');
const path = require('path');

const TOKENIZER_MAGIC = 20240328, TOKENIZER_VERSION = 2;
const MERGES_MAGIC = 20261102, MERGES_VERSION = 1;
const HEADER_INTS = 256;

const dir = process.argv[2] || path.join('data', 'tokenizer');
function die(msg) { console.error(`tokenizer_files: error: ${msg}`); process.exit(1); }
for (const f of ['encoder.json', 'vocab.bpe']) {
  if (!fs.existsSync(path.join(dir, f))) die(`${path.join(dir, f)} not found; run scripts/fetch_tokenizer.sh ${dir} first`);
}

// GPT-2's bytes<->unicode table: printable Latin-1 bytes stand for
// themselves, the other 68 bytes get code points 256, 257, ... in byte order.
function byteToUnicode() {
  const printable = b => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  const table = new Array(256);
  let next = 256;
  for (let b = 0; b < 256; b++) table[b] = String.fromCodePoint(printable(b) ? b : next++);
  return table;
}
const b2u = byteToUnicode();
const u2b = new Map(b2u.map((ch, b) => [ch, b]));

const encoder = JSON.parse(fs.readFileSync(path.join(dir, 'encoder.json'), 'utf8'));
const N = Object.keys(encoder).length;
const tokens = new Array(N);          // id -> string
for (const [s, id] of Object.entries(encoder)) {
  if (!Number.isInteger(id) || id < 0 || id >= N || tokens[id] !== undefined) die(`encoder.json: bad or duplicate id ${id} for ${JSON.stringify(s)}`);
  tokens[id] = s;
}
const EOT = encoder['<|endoftext|>'];
if (EOT === undefined) die('encoder.json has no <|endoftext|>');
const tokenBytes = tokens.map((s, id) => {
  const bytes = [];
  for (const ch of s) {
    if (!u2b.has(ch)) die(`token ${id} ${JSON.stringify(s)} has a character outside GPT-2's byte table`);
    bytes.push(u2b.get(ch));
  }
  if (bytes.length < 1 || bytes.length > 255) die(`token ${id} has ${bytes.length} bytes (need 1..255)`);
  return Buffer.from(bytes);
});

// vocab.bpe: "#version" line, one "left right" per line, trailing newline.
const lines = fs.readFileSync(path.join(dir, 'vocab.bpe'), 'utf8').split('\n');
if (!lines[0].startsWith('#version')) die('vocab.bpe: first line is not #version');
if (lines[lines.length - 1] !== '') die('vocab.bpe: no trailing newline');
const merges = lines.slice(1, -1).map((line, i) => {
  const parts = line.split(' ');
  if (parts.length !== 2) die(`vocab.bpe line ${i + 2}: expected "left right", got ${JSON.stringify(line)}`);
  const [l, r] = parts, m = l + r;
  for (const t of [l, r, m]) if (!(t in encoder)) die(`vocab.bpe line ${i + 2}: ${JSON.stringify(t)} is not in encoder.json`);
  return [encoder[l], encoder[r], encoder[m]];
});
const M = merges.length;

// The reference's rank table: key left + ',' + right -> rank (a later
// duplicate key would overwrite an earlier one; GPT-2 has none: checked).
const jsKey = new Map();
merges.forEach(([l, r], rank) => {
  const key = tokens[l] + ',' + tokens[r];
  if (jsKey.has(key)) die(`merges ${jsKey.get(key)} and ${rank} share the reference's key ${JSON.stringify(key)}; not supported`);
  jsKey.set(key, rank);
});
const realPair = new Set(merges.map(([l, r]) => l * 65536 + r));
const aliases = [];
for (const [key, rank] of jsKey) {
  for (let p = key.indexOf(','); p >= 0; p = key.indexOf(',', p + 1)) {
    const l = key.slice(0, p), r = key.slice(p + 1);
    if (!(l in encoder) || !(r in encoder) || realPair.has(encoder[l] * 65536 + encoder[r])) continue;
    if (!((l + r) in encoder)) die(`alias pair ${JSON.stringify([l, r])} joins to a string outside the vocabulary`);
    aliases.push([encoder[l], encoder[r], encoder[l + r], rank]);
  }
}

function header(ints) {
  const h = Buffer.alloc(HEADER_INTS * 4);
  ints.forEach((v, i) => h.writeInt32LE(v, 4 * i));
  return h;
}
function writeAtomic(file, buf) { fs.writeFileSync(file + '.tmp', buf); fs.renameSync(file + '.tmp', file); }

const decPath = path.join(dir, 'gpt2_tokenizer.bin');
const parts = [header([TOKENIZER_MAGIC, TOKENIZER_VERSION, N, EOT])];
for (const b of tokenBytes) parts.push(Buffer.from([b.length]), b);
writeAtomic(decPath, Buffer.concat(parts));

const mergePath = path.join(dir, 'gpt2_merges.bin');
const body = Buffer.alloc(12 * M + 16 * aliases.length);
merges.forEach((m, i) => m.forEach((v, j) => body.writeInt32LE(v, 12 * i + 4 * j)));
aliases.forEach((a, i) => a.forEach((v, j) => body.writeInt32LE(v, 12 * M + 16 * i + 4 * j)));
writeAtomic(mergePath, Buffer.concat([header([MERGES_MAGIC, MERGES_VERSION, N, M, EOT, aliases.length]), body]));

// ---- read both back and check against the JSON ----
let bad = 0;
function check(cond, msg) { if (!cond) { if (bad++ < 10) console.error(`tokenizer_files: mismatch: ${msg}`); } }
const dec = fs.readFileSync(decPath);
check(dec.readInt32LE(0) === TOKENIZER_MAGIC && dec.readInt32LE(4) === TOKENIZER_VERSION, 'decode header magic/version');
check(dec.readInt32LE(8) === N && dec.readInt32LE(12) === EOT, 'decode header sizes');
let off = HEADER_INTS * 4;
for (let id = 0; id < N; id++) {
  const len = dec[off];
  const got = dec.subarray(off + 1, off + 1 + len);
  // decode the bytes back to the JSON's string through the byte table
  const s = Array.from(got, b => b2u[b]).join('');
  check(s === tokens[id], `token ${id}: file has ${JSON.stringify(s)}, encoder.json ${JSON.stringify(tokens[id])}`);
  off += 1 + len;
}
check(off === dec.length, `decode file has ${dec.length - off} bytes after the last token`);
const mb = fs.readFileSync(mergePath);
check(mb.readInt32LE(0) === MERGES_MAGIC && mb.readInt32LE(4) === MERGES_VERSION, 'merges header magic/version');
check(mb.readInt32LE(8) === N && mb.readInt32LE(12) === M && mb.readInt32LE(16) === EOT && mb.readInt32LE(20) === aliases.length, 'merges header sizes');
check(mb.length === 1024 + 12 * M + 16 * aliases.length, 'merges file size');
for (let i = 0; i < M; i++) {
  const l = mb.readInt32LE(1024 + 12 * i), r = mb.readInt32LE(1028 + 12 * i), m = mb.readInt32LE(1032 + 12 * i);
  const want = lines[i + 1];
  check(tokens[l] + ' ' + tokens[r] === want && tokens[m] === tokens[l] + tokens[r], `merge ${i}: file has ${l} ${r} -> ${m}, vocab.bpe ${JSON.stringify(want)}`);
}
for (let i = 0; i < aliases.length; i++) {
  const o = 1024 + 12 * M + 16 * i;
  const l = mb.readInt32LE(o), r = mb.readInt32LE(o + 4), m = mb.readInt32LE(o + 8), rank = mb.readInt32LE(o + 12);
  check(jsKey.get(tokens[l] + ',' + tokens[r]) === rank && tokens[m] === tokens[l] + tokens[r], `alias ${i}`);
}
if (bad) die(`${bad} mismatches between the written files and the JSON`);
console.log(`tokenizer_files: wrote ${decPath} (${dec.length} bytes, ${N} tokens, eot ${EOT}) and ${mergePath} (${mb.length} bytes, ${M} merges, ${aliases.length} alias pairs); read back: all agree`);
