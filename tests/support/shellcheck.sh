#!/usr/bin/env bash
# Runs shellcheck [OPTIONS] FILE... for the CTest tests of shell scripts.
#
# The tests that call it are registered whether or not shellcheck is installed (see
# kit_add_shellcheck_test in tests/CMakeLists.txt): without it they fail with this one line,
# because a test that vanished would look the same as a test that passed.
if ! command -v shellcheck >/dev/null 2>&1; then
  echo "shellcheck is not installed, so these scripts were not checked: ./kit test installs it" \
       "(or: apt-get install shellcheck)" >&2
  exit 1
fi
exec shellcheck "$@"
