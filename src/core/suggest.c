#include "core/suggest.h"

#include <string.h>

static int edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 127 || lb > 127) return 1 << 20;
    int row[128];
    for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (row[j] + 1 < best) best = row[j] + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

const char *suggest_closest(const char *word, const char *const *candidates, int n) {
    const char *best = NULL;
    int best_d = 1 << 30;
    for (int i = 0; i < n; i++) {
        int d = edit_distance(word, candidates[i]);
        if (d < best_d) best_d = d, best = candidates[i];
    }
    int limit = (int)strlen(word) / 3;
    if (limit < 2) limit = 2;
    return best_d <= limit ? best : NULL;
}
