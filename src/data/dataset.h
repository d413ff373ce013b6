// A dataset as one packed token stream: every document's ids, <|endoftext|> after each text
// document, documents in file order. The loader (data/loader.h) cuts it into windows.
//
// Sources (stream_open's path):
//   .npy    a token stream, used as is (no end-of-document ids are added); every id must be
//           in [0, vocab_size). It is never read into memory: stream_read maps the pages of the
//           range it reads, for that read only, so resident memory does not grow with the
//           corpus (a folder of .npy shards written by `ctitan tokenize` can be any size). The
//           ids are checked once at open, streaming through the files.
//   .txt    one document: the whole file.
//   .jsonl  one document per non-empty line, each line one of (one kind per file; a line of
//           another kind is an error naming file:line):
//             {"text": "..."}                  a text document;
//             {"messages": [...], "tools"?: [...]}  a conversation (HF's conversational
//                                              format), rendered with the model's chat template
//                                              (text/chat.h) as apply_chat_template renders it;
//             {"ids": [...], "mask"?: [...]}   pre-tokenized (`ctitan tokenize` writes these):
//                                              with "mask" a conversation (mask 1 = trained),
//                                              without a text document.
//           A line that is not JSON, or has none of those fields, is an error naming file:line.
//   folder  its .txt, .jsonl and .npy files in byte-wise sorted name order, concatenated. Not
//           recursive; other files, sub-folders and hidden (dot) files are ignored. A folder
//           with none of those files is an error.
// An empty (0-byte) file, or a .jsonl of blank lines only, is an error.
// Text is bytes: NUL and the other control characters are characters like any other, in a .txt
// and in a .jsonl (as \u0000 escapes or raw), and give Hugging Face's ids.
// With two or more text files, a document in two of them (the same text as a .txt and a .jsonl,
// or a file copied twice) is trained twice: `warning` names the first two files that share a
// document (a .jsonl text or a whole .txt, found again as a document or a line of a .txt).
//
// Which tokens are trained, and where documents start (STREAM_TRAIN, STREAM_DOC_START):
//   - a text document (and .npy) is trained on every token; a document starts at the stream's
//     first token and after each end-of-document id;
//   - a conversation is its own document, with no <|endoftext|> after it. Under
//     train_on_all every token is trained; otherwise only its assistant turns' tokens
//     (text/chat_mask.h: from after "<|im_start|>assistant\n" through its "<|im_end|>").
//
// Invalid UTF-8 follows the tokenizer's rule for readers of user files (core/utf8.h): each
// maximal ill-formed subsequence becomes U+FFFD, as Python's errors="replace", so the ids match
// what Hugging Face sees. The stream counts the replacements and describes the first in
// `warning` for the caller to log (library code prints nothing).
//
// Text is tokenized once, at open, on `threads` OpenMP threads over documents (a long .txt is
// cut where tok_cut_points says the ids do not change); the result does not depend on the
// thread count.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "io/npy.h"
#include "text/tokenizer.h"

typedef struct chat_template chat_template; // text/chat.h

enum { STREAM_TRAIN = 1, STREAM_DOC_START = 2 }; // a token's flags

// A run of the stream: tokens [first, first + n) are in memory from tokens[mem_first], or in
// the .npy file npy[npy] from its token 0.
typedef struct stream_part {
    uint64_t first, n;
    uint64_t mem_first;
    int npy; // -1: in memory
} stream_part;

typedef struct token_stream {
    uint64_t n_tokens;
    int32_t *tokens; // the text's ids, in memory (n_mem), malloc'd; owned
    uint8_t *flags;  // (n_mem) when the stream holds a conversation, else NULL; owned
    size_t n_mem;
    npy_tokens *npy; // the open .npy files; owned
    size_t n_npy;
    stream_part *parts;
    size_t n_parts;
    int32_t eos;         // the end-of-document id, -1 when not known (.npy without a tokenizer)
    char *path;          // as given to stream_open, for messages; owned
    uint64_t n_files;    // files read (1 unless path is a folder)
    uint64_t n_docs;     // text documents (each followed by <|endoftext|>); .npy files count 0
    uint64_t n_chats;    // conversations
    uint64_t n_trained;  // tokens of conversations that are trained
    uint64_t n_replaced; // invalid UTF-8 sequences replaced by U+FFFD
    char warning[1024];  // "" or, for the log, the first replacement and files sharing
                         // documents ("; " between them)
} token_stream;

typedef struct stream_options {
    const tokenizer *tok;      // may be NULL when only .npy files are read; text is then an error
    const chat_template *chat; // may be NULL: a conversation is then an error naming chat_from
    const char *chat_from;     // where the template was looked for (messages)
    int32_t vocab_size;        // every id is checked to be in [0, vocab_size); <= 0: no check
    int threads;               // <= 0: OpenMP's default
    bool train_on_all;         // conversations: train every token, not only the assistant's
} stream_options;

// Reads and tokenizes path into s (see above). On failure s is left empty (stream_free is safe).
int stream_open_with(token_stream *s, const char *path, const stream_options *o, ct_error *err);
// The same with only a tokenizer (no chat template).
int stream_open(token_stream *s, const char *path, const tokenizer *tok, int32_t vocab_size,
                int threads, ct_error *err);
void stream_free(token_stream *s);

// Copies tokens [first, first + n) into ids and, when flags is non-NULL, their flags. A token
// that starts a document after an end-of-document id (text and .npy) has STREAM_DOC_START only
// when that id is inside the range read: flags[0] has it only from a conversation's own flags,
// or at the stream's first token. Allocates nothing; the error names the file (a failed
// mapping of a .npy's pages).
int stream_read(const token_stream *s, uint64_t first, size_t n, int32_t *ids, uint8_t *flags,
                ct_error *err);
