# Sourced by the Slurm scripts: slurmd runs them with no PATH and none of its own environment, so
# cairn is found relative to this file: <prefix>/share/cairn/slurm/ -> <prefix>/bin/cairn when
# installed, <checkout>/workflow/slurm/ -> <checkout>/build/bin/cairn in a source checkout.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
cairn_here=$(dirname "$(readlink -f "$0")")
cairn_bin=""
for c in "$cairn_here/../../../bin/cairn" "$cairn_here/../../build/bin/cairn"; do
  if [ -x "$c" ]; then cairn_bin=$(readlink -f "$c"); break; fi
done
