/* The C test programs' checks: CHECK counts each check and reports a failed one with cairn's last
 * error; main ends with `failures ? 1 : 0`. One program per file: the counters are static. */
#ifndef CAIRN_TEST_CHECK_H
#define CAIRN_TEST_CHECK_H

#include <stdio.h>

#include "cairn/cairn.h"

static int checks = 0;
static int failures = 0;

#define CHECK(cond)                                                                                                \
  do {                                                                                                             \
    ++checks;                                                                                                      \
    if (!(cond)) {                                                                                                 \
      ++failures;                                                                                                  \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: %s\n", __FILE__, __LINE__, #cond, cairn_last_error()); \
    }                                                                                                              \
  } while (0)

#endif
