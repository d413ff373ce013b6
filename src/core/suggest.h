// "Did you mean ...?" for unknown names: the candidate closest by edit distance.
#pragma once

// Returns the candidate with the smallest Levenshtein distance to `word` if that distance is
// small relative to the word (at most max(2, len/3)); NULL if none is close.
const char *suggest_closest(const char *word, const char *const *candidates, int n);
