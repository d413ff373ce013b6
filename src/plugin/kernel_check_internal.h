// What kernel_check.c shares with kernel_check_isolate.c, and nothing else includes.
#pragma once
#include "core/error.h"
#include "plugin/kernel_check.h"

// 0 if `sh` is a shape the check can build its cases from, else -1 with *err naming every
// field ("kernel check: bad model shape T=... NKV=3 ..."). Both entry points check it first,
// the isolated one before it forks.
int kernel_check_validate_shape(const kernel_check_shape *sh, ct_error *err);
