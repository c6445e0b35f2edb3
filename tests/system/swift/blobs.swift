// A blob put by one leaf is read by another (tests/system/test_swift.py).
import io;
import blob;
import cairn;

main {
  blob b = blob_from_floats([1.5, 2.5, 3.0]);
  int n = cairn_put_blob("swift/scores", b);
  printf("put %i bytes", n);
  wait (n) {
    blob c = cairn_get_blob("swift/scores");
    float f[] = floats_from_blob(c);
    printf("got %0.1f %0.1f %0.1f", f[0], f[1], f[2]);
    int found = cairn_poll("swift/scores", 0);
    printf("poll=%i", found);
  }
}
