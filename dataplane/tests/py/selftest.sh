#!/bin/sh
# Self-test of the HBONE test peers: mints a throwaway PKI with openssl and
# runs hbone_client.py against hbone_server.py.  Exit status 0 = all checks
# passed.  Pass --keep to keep the temporary directory.
set -e
exec /usr/bin/python3 "$(dirname "$0")/selftest.py" "$@"
