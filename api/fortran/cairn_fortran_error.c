/* cairn_fortran_error.c -- the thread-local error detail of checks made by the Fortran module itself.
 *
 * The module `cairn` (cairn.f90) checks some arguments before it calls the C API (a `dims` that
 * does not match the array, an array whose kind or shape is not the stored tensor's). Their message
 * has to live where cairn_last_error()'s does: per thread, valid until the next call. Fortran has no
 * thread-local variables, so it lives here. The Fortran function cairn_last_error() returns this
 * message when it is set, else the C library's. Every wrapper clears it on entry.
 */
#include <stddef.h>
#include <string.h>

enum { kMessageBytes = 1024 };

static _Thread_local char message[kMessageBytes];

/* Sets the message (NUL-terminated; "" clears it). Longer messages are cut at kMessageBytes - 1. */
void cairn_fortran_set_error(const char* text) {
  size_t n = text == NULL ? 0 : strlen(text);
  if (n >= kMessageBytes) n = kMessageBytes - 1;
  if (n > 0) memcpy(message, text, n);
  message[n] = '\0';
}

/* The message set last on this thread ("" if none). */
const char* cairn_fortran_error(void) { return message; }
