/* The stand-alone test's C client (`spack test run cairn`): compiled as C99 against the installed
 * <cairn/cairn.h> and libcairn, it needs no daemon. It checks the status table and that connecting
 * to a socket where no daemon listens fails with CAIRN_ERR_UNAVAILABLE and names the path. */
#include <cairn/cairn.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  const char* ok = cairn_status_string(CAIRN_OK);
  if (ok == NULL || ok[0] == '\0') {
    fprintf(stderr, "cairn_status_string(CAIRN_OK) is empty\n");
    return 1;
  }
  const char* sock = "/nonexistent/cairn-spack-smoke/cairnd.sock";
  cairn_client* c = NULL;
  cairn_status s = cairn_connect(sock, &c);
  if (s != CAIRN_ERR_UNAVAILABLE || c != NULL) {
    fprintf(stderr, "cairn_connect(%s) returned %d (%s), expected CAIRN_ERR_UNAVAILABLE\n", sock, (int)s,
            cairn_status_string(s));
    cairn_disconnect(c);
    return 1;
  }
  if (strstr(cairn_last_error(), sock) == NULL) {
    fprintf(stderr, "cairn_last_error() does not name the socket: %s\n", cairn_last_error());
    return 1;
  }
  printf("cairn C client: %s; no daemon: %s\n", ok, cairn_status_string(s));
  return 0;
}
