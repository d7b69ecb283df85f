#!/usr/bin/env bash
# Commit subjects are one line of at most 72 characters, from the first commit after e68f326 (where
# issue 40 asked for a readable history; the subjects before it are left as they are). Run by
# scripts/test.sh. A clone without that commit (a shallow one) is told so and not checked.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=e68f326
if ! git rev-parse -q --verify "$BASE^{commit}" >/dev/null 2>&1; then
    echo "check_subjects: $BASE is not in this clone's history (shallow?): subjects not checked"
    exit 0
fi
long=$(git log --format='%h%x09%s' "$BASE..HEAD" | awk -F '\t' 'length($2) > 72 { print $1 " (" length($2) " characters): " $2 }')
if [ -n "$long" ]; then
    echo "commit subjects longer than 72 characters (put the details in the body):" >&2
    echo "$long" >&2
    exit 1
fi
echo "check_subjects: $(git rev-list --count "$BASE..HEAD") commits since $BASE, every subject at most 72 characters"
