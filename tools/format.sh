#!/usr/bin/env bash
# clang-format (14 or newer, .clang-format) over every C++ and CUDA source of the repository.
# Usage: tools/format.sh          reformat in place
#        tools/format.sh --check  change nothing; list the files that differ and exit 1 if any
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
command -v clang-format >/dev/null || "$root/tools/deps.sh" clang-format
if ! command -v clang-format >/dev/null; then
  echo "tools/format.sh: clang-format not found (Debian: apt-get install clang-format)" >&2
  exit 1
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
else
  mapfile -t files < <(find apps bench examples include src tests -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh')
fi
# .clang-format-ignore: path patterns (shell globs) of files to leave alone; comments start with '#'.
if [ -f .clang-format-ignore ]; then
  mapfile -t ignored < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' .clang-format-ignore)
  kept=()
  for f in "${files[@]}"; do
    skip=0
    for pattern in "${ignored[@]}"; do
      # shellcheck disable=SC2053
      [[ "$f" == $pattern ]] && skip=1 && break
    done
    ((skip)) || kept+=("$f")
  done
  files=("${kept[@]}")
fi
if [ "${1:-}" != "--check" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "tools/format.sh: ${#bad[@]} file(s) differ from clang-format (run tools/format.sh):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "format: ${#files[@]} files match clang-format"
