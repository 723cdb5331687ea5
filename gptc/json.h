/*
 * gptc/json.h — a small JSON reader: enough to take one field out of a
 * JSONL line (prepare_data's and --data's "text", HellaSwag's fields) and to
 * walk the header of a Hugging Face safetensors file. It checks that a line
 * is exactly one valid JSON object, skips any other value, and decodes
 * strings with all their escapes; errors say what is wrong and where.
 *
 * Included by gptc/text_data.h (and through it gptc/eval_data.h) and
 * gptc/safetensors.h. Defines: utf8_put, hex4; json_space, json_string,
 * JsonError, json_fail, json_number, json_skip, json_object_value,
 * json_object_field.
 */
#ifndef GPTC_JSON_H
#define GPTC_JSON_H

#include "util.h" /* xmalloc */

/* Append the UTF-8 encoding of code point cp. */
static size_t utf8_put(char* out, uint32_t cp) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | cp >> 6); out[1] = (char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12); out[1] = (char)(0x80 | ((cp >> 6) & 63)); out[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18); out[1] = (char)(0x80 | ((cp >> 12) & 63));
    out[2] = (char)(0x80 | ((cp >> 6) & 63)); out[3] = (char)(0x80 | (cp & 63));
    return 4;
}

static int hex4(const char* s, uint32_t* v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        *v = *v << 4 | (uint32_t)d;
    }
    return 0;
}

/* A small JSON reader, enough to find one string field of an object on one
 * line: it skips any other value (nested objects, arrays, numbers, literals)
 * and decodes the field's string with all escapes (\uXXXX with surrogate
 * pairs; a lone surrogate becomes U+FFFD). *p walks [*p, end). */
static void json_space(const char** p, const char* end) {
    while (*p < end && (**p == ' ' || **p == '\t' || **p == '\r' || **p == '\n')) (*p)++;
}

/* Parse a string at *p (which must point at its opening quote). If out is
 * not NULL, writes the decoded bytes (at most the raw length). Returns the
 * decoded length, or -1 if malformed. */
static long json_string(const char** p, const char* end, char* out) {
    const char* s = *p;
    if (s >= end || *s != '"') return -1;
    s++;
    long n = 0;
    while (s < end && *s != '"') {
        if ((unsigned char)*s < 0x20) return -1;
        if (*s != '\\') {
            if (out) out[n] = *s;
            n++;
            s++;
            continue;
        }
        if (++s >= end) return -1;
        char c = *s++;
        const char* simple = strchr("\"\\/bfnrt", c);
        if (simple && c) {
            static const char decoded[] = "\"\\/\b\f\n\r\t";
            if (out) out[n] = decoded[simple - "\"\\/bfnrt"];
            n++;
        } else if (c == 'u') {
            uint32_t cp;
            if (end - s < 4 || hex4(s, &cp) != 0) return -1;
            s += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && end - s >= 6 && s[0] == '\\' && s[1] == 'u') {
                uint32_t lo;
                if (hex4(s + 2, &lo) == 0 && lo >= 0xDC00 && lo < 0xE000) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    s += 6;
                }
            }
            if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD; /* lone surrogate */
            char buf[4];
            size_t k = utf8_put(buf, cp);
            if (out) memcpy(out + n, buf, k);
            n += (long)k;
        } else {
            return -1;
        }
    }
    if (s >= end) return -1;
    *p = s + 1;
    return n;
}

/* Why the line is not valid JSON, for the error message: the first
 * problem found (static text), and where (*at). */
typedef struct {
    const char* why;
    const char* at;
} JsonError;

static int json_fail(JsonError* e, const char* why, const char* at) {
    if (!e->why) { e->why = why; e->at = at; }
    return -1;
}

/* A number as JSON writes it: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static int json_number(const char** p, const char* end) {
    const char* s = *p;
    if (s < end && *s == '-') s++;
    if (s < end && *s == '0') s++;
    else if (s < end && *s >= '1' && *s <= '9') while (s < end && *s >= '0' && *s <= '9') s++;
    else return -1;
    if (s < end && *s == '.') {
        if (++s >= end || *s < '0' || *s > '9') return -1;
        while (s < end && *s >= '0' && *s <= '9') s++;
    }
    if (s < end && (*s == 'e' || *s == 'E')) {
        s++;
        if (s < end && (*s == '+' || *s == '-')) s++;
        if (s >= end || *s < '0' || *s > '9') return -1;
        while (s < end && *s >= '0' && *s <= '9') s++;
    }
    *p = s;
    return 0;
}

#define JSON_MAX_DEPTH 64

/* Skip one JSON value of any kind. 0 on success, -1 (and *e) if malformed. */
static int json_skip(const char** p, const char* end, int depth, JsonError* e) {
    json_space(p, end);
    if (*p >= end) return json_fail(e, "a value is missing", *p);
    if (depth > JSON_MAX_DEPTH) return json_fail(e, "objects and arrays nested too deep (more than 64 levels)", *p);
    char c = **p;
    if (c == '"') return json_string(p, end, NULL) < 0 ? json_fail(e, "a string is malformed or unterminated", *p) : 0;
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        (*p)++;
        json_space(p, end);
        if (*p < end && **p == close) { (*p)++; return 0; }
        for (;;) {
            if (c == '{') {
                json_space(p, end);
                if (json_string(p, end, NULL) < 0) return json_fail(e, "a key is not a string", *p);
                json_space(p, end);
                if (*p >= end || **p != ':') return json_fail(e, "a ':' is missing after a key", *p);
                (*p)++;
            }
            if (json_skip(p, end, depth + 1, e) != 0) return -1;
            json_space(p, end);
            if (*p < end && **p == ',') { (*p)++; continue; }
            if (*p < end && **p == close) { (*p)++; return 0; }
            return json_fail(e, c == '{' ? "a ',' or '}' is missing" : "a ',' or ']' is missing", *p);
        }
    }
    static const char* const literals[3] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t k = strlen(literals[i]);
        if ((size_t)(end - *p) >= k && memcmp(*p, literals[i], k) == 0) { *p += k; return 0; }
    }
    if (json_number(p, end) == 0) return 0;
    return json_fail(e, "a value is not JSON (a string, number, object, array, true, false or null)", *p);
}

/* Read the line [line, end) as exactly one JSON object (nothing but white
 * space after it) and find its field `key`, of any type: *value_at points
 * at the field's value (white space skipped) inside the line. Returns 0
 * when found, -2 if the object has no such field (*value_at NULL), -1
 * (and *e) if the line is not one valid JSON object. */
static int json_object_value(const char* line, const char* end, const char* key, const char** value_at, JsonError* e) {
    const char* p = line;
    *value_at = NULL;
    json_space(&p, end);
    if (p >= end || *p != '{') return json_fail(e, "the line does not start a JSON object ('{')", p);
    p++;
    json_space(&p, end);
    size_t klen = strlen(key);
    if (p < end && *p == '}') p++;
    else for (;;) {
        json_space(&p, end);
        const char* kstart = p;
        char kbuf[64];
        long kl = json_string(&p, end, NULL);
        if (kl < 0) return json_fail(e, "a key is not a string", kstart);
        int match = 0;
        if ((size_t)kl == klen && kl < (long)sizeof(kbuf)) {
            const char* q = kstart;
            json_string(&q, end, kbuf);
            match = memcmp(kbuf, key, klen) == 0;
        }
        json_space(&p, end);
        if (p >= end || *p != ':') return json_fail(e, "a ':' is missing after a key", p);
        p++;
        json_space(&p, end);
        if (match && *value_at) return json_fail(e, "the field appears twice", kstart);
        if (match) *value_at = p;
        int was_string = p < end && *p == '"';
        if (json_skip(&p, end, 1, e) != 0) return -1;
        json_space(&p, end);
        if (p < end && *p == ',') { p++; continue; }
        if (p < end && *p == '}') { p++; break; }
        /* after a string, most often a '"' inside the text that was not escaped as \" */
        return json_fail(e, p >= end     ? "the object is not closed on this line ('}' missing)"
                            : was_string ? "a ',' or '}' is missing after a string (an unescaped '\"' inside it?)"
                                         : "a ',' or '}' is missing after a value", p);
    }
    json_space(&p, end);
    if (p < end) return json_fail(e, "more follows the object on the same line (one object per line)", p);
    return *value_at ? 0 : -2;
}

/* The same for a string field: returns its decoded length and a malloc'd
 * copy in *value; -1 (and *e) if the line is not one valid JSON object;
 * -2 if the object has no such field or it is not a string. */
static long json_object_field(const char* line, const char* end, const char* key, char** value, JsonError* e) {
    const char* at = NULL;
    *value = NULL;
    int rc = json_object_value(line, end, key, &at, e);
    if (rc != 0) return rc;
    if (*at != '"') return -2;
    const char* q = at;
    long n = json_string(&q, end, NULL); /* (valid: json_object_value read it) */
    *value = (char*)xmalloc((size_t)n + 1);
    json_string(&at, end, *value);
    (*value)[n] = '\0';
    return n;
}

#endif /* GPTC_JSON_H */
