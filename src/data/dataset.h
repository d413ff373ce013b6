// A dataset as one packed token stream in memory: every document's ids, <|endoftext|> after
// each text document, documents in file order. The loader (data/loader.h) cuts it into windows.
//
// Sources (stream_open's path):
//   .npy    a token stream, used as is (no end-of-document ids are added); every id must be
//           in [0, vocab_size).
//   .txt    one document: the whole file.
//   .jsonl  one document per non-empty line, its "text" field (a string). A line that is not
//           JSON, or has no string "text", is an error naming file:line.
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
// Invalid UTF-8 follows the tokenizer's rule for readers of user files (text/utf8.h): each
// maximal ill-formed subsequence becomes U+FFFD, as Python's errors="replace", so the ids match
// what Hugging Face sees. The stream counts the replacements and describes the first in
// `warning` for the caller to log (library code prints nothing).
//
// Text is tokenized once, at open, on `threads` OpenMP threads over documents (a long .txt is
// cut where tok_cut_points says the ids do not change); the result does not depend on the
// thread count.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "text/tokenizer.h"

typedef struct token_stream {
    int32_t *tokens; // (n_tokens), malloc'd; owned
    size_t n_tokens;
    char *path;          // as given to stream_open, for messages; owned
    uint64_t n_files;    // files read (1 unless path is a folder)
    uint64_t n_docs;     // text documents (each followed by <|endoftext|>); .npy files count 0
    uint64_t n_replaced; // invalid UTF-8 sequences replaced by U+FFFD
    char warning[1024];  // "" or, for the log, the first replacement and files sharing
                         // documents ("; " between them)
} token_stream;

// Reads and tokenizes path into s (see above). tok may be NULL when only .npy files are read;
// text then is an error. Every id (from .npy files, and the tokenizer's ids including the
// end-of-document id) is checked to be in [0, vocab_size); vocab_size <= 0 disables the check.
// threads <= 0 means OpenMP's default. On failure s is left empty (stream_free is safe).
int stream_open(token_stream *s, const char *path, const tokenizer *tok, int32_t vocab_size,
                int threads, ct_error *err);
void stream_free(token_stream *s);
