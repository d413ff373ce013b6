// XXH64 (the xxHash specification's 64-bit hash): the checksum of checkpoint files and of the
// ranks' weights before a save. It runs at memory speed. XXH64("", 0) = 0xEF46DB3751D8E999.
#pragma once
#include <stddef.h>
#include <stdint.h>

uint64_t ct_xxh64(const void *data, size_t len, uint64_t seed);
// The same over a read-only file mapping, whose pages leave this process as they are read
// (the page cache keeps them): a checksum of a file larger than memory holds 16 MiB at a time.
uint64_t ct_xxh64_file_map(const void *map, size_t len, uint64_t seed);
