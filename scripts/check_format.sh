#!/usr/bin/env bash
# Checks that every C++ file in the repository is formatted as .clang-format
# says; lists the files that are not. Fix with:
#   git ls-files '*.cc' '*.h' '*.cu' | xargs clang-format -i
# Usage: bash scripts/check_format.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bad=()
while IFS= read -r f; do
  if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then
    bad+=("$f")
  fi
done < <(git ls-files '*.cc' '*.h' '*.cu')
if [ ${#bad[@]} -ne 0 ]; then
  printf 'check_format: not formatted as .clang-format says (fix: clang-format -i FILE):\n' >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check_format: $(git ls-files '*.cc' '*.h' '*.cu' | wc -l) files formatted"
