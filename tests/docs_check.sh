#!/usr/bin/env bash
# tests/docs_check.sh - the documents name what the code has: docs/testing.md every test
# program (tests/test_NAME.c) and fuzz target (fuzz/fuzz_NAME.c), docs/format.md every
# section kvcache.h saves (each KVC__TAG, as `NAME`) and every kind of saved object (each
# KVC__WHAT_ value, in the header table's "what" row), and the INDEX at the top of kvcache.h
# and kvcache_vk.h every public function (and nothing else). tests/run.sh and `make check` run
# it; one check per item, the last line "RESULT docs <passed> <failed>" (tests/tk.h's).
set -u
cd "$(dirname "$0")/.."
passed=0 failed=0

# need FILE TEXT WHAT: FILE mentions TEXT (WHAT says what TEXT is)
need() {
  if grep -qF -- "$2" "$1"; then passed=$((passed + 1))
  else failed=$((failed + 1)); echo "$1 does not mention $2 ($3)"; fi
}

for t in tests/test_*.c; do need docs/testing.md "$t" "a test program"; done
for f in fuzz/fuzz_*.c; do
  [ "$f" = fuzz/fuzz_replay.c ] || need docs/testing.md "\`$(basename "$f" .c)\`" "a fuzz target"
done
for tag in $(grep -o "KVC__TAG('[A-Z]', '[A-Z]', '[A-Z]', '[A-Z]')" kvcache.h | sed "s/KVC__TAG//; s/[^A-Z]//g" | sort -u); do
  need docs/format.md "\`$tag\`" "a section kvcache.h saves"
done
what_row=$(grep -F 'u32 what:' docs/format.md)
for w in $(sed -n 's/^#define KVC__WHAT_[A-Z_]*[[:space:]]*\([0-9]*\)u.*/\1/p' kvcache.h); do
  case $what_row in
    *"$w = "*) passed=$((passed + 1)) ;;
    *) failed=$((failed + 1)); echo "docs/format.md: the header's what row has no $w (a kind of saved object)" ;;
  esac
done
# every public function (a KVCDEF prototype of the header's API part) has its line in the
# header's INDEX, and every line of the index is a public function
for h in kvcache.h kvcache_vk.h; do
  guard=$( [ $h = kvcache.h ] && echo KVCACHE_H || echo KVCACHE_VK_H )
  api=$(sed -n "1,/^#endif \/\* $guard \*\//p" $h | grep '^KVCDEF' | grep -o 'kvc_[a-z0-9_]*(' | tr -d '(' | sort -u)
  index=$(sed -n '/^   INDEX/,/^   (end of index)/p' $h | grep -o '^ *kvc_[a-z0-9_]*(' | tr -d ' (' | sort -u)
  [ -n "$index" ] || { failed=$((failed + 1)); echo "$h: no INDEX block"; }
  for f in $api; do
    if printf '%s\n' "$index" | grep -qx "$f"; then passed=$((passed + 1))
    else failed=$((failed + 1)); echo "$h: $f is not in the INDEX of its top comment (a public function)"; fi
  done
  for f in $index; do
    printf '%s\n' "$api" | grep -qx "$f" ||
      { failed=$((failed + 1)); echo "$h: the INDEX names $f, which is no public function"; }
  done
done
# tools/api_rename.py: nothing in the tree is left to migrate, and the script does what
# the CHANGELOG says on a sample (renames, folds by argument count, runtime fields), once
if command -v python3 >/dev/null; then
  if python3 tools/api_rename.py --check >/dev/null; then passed=$((passed + 1))
  else failed=$((failed + 1)); echo "old API names left: python3 tools/api_rename.py --dry-run"; fi
  tmp=$(mktemp -d)
  # api_rename: keep (the sample's old spellings)
  cat >"$tmp/old.c" <<'OLD'
static void f(kvc_cache *c, kvc_radix *t, kvc_namespace ns, const int32_t *tok, int32_t n, kvc_snapshot *s) {
    kvc_pool_config pc, bad;
    kvc_memory_config *m = NULL;
    pc.allocator.alloc = NULL; bad.n_workers = 1; m->lock = NULL; g[0].pool.cpu_disable = 0;
    kvc_threads_attach(th, &pc);
    want = "lock";
    name = "lock";
    kvc_begin(c, f(1, 2));
    kvc_begin_checkpoints(c, n, at, 2);
    kvc_snapshot_take(c, 0, &s);   /* aligned */
    kvc_snapshot_take_at(c, 0, n, &s);
    kvc_radix_commit(t, ns, c, tok, n);
    kvc_radix_commit_priority(t, ns, c, tok, n, 2);
    kvc_trim(c, 1); kvc_restore(c, NULL, 0); kvc_memory_trim(mem, 1); mp->lock(u); kvc_vk_cmd_sync(p, cmd);
}
OLD
  cat >"$tmp/new.c" <<'NEW'
static void f(kvc_cache *c, kvc_radix *t, kvc_namespace ns, const int32_t *tok, int32_t n, kvc_snapshot *s) {
    kvc_pool_config pc, bad;
    kvc_memory_config *m = NULL;
    pc.runtime.allocator.alloc = NULL; bad.runtime.n_workers = 1; m->runtime.lock = NULL; g[0].pool.runtime.cpu_disable = 0;
    kvc_threads_attach(th, &pc.runtime);
    want = "runtime.lock";
    name = "lock";
    kvc_begin(c, f(1, 2), NULL, 0);
    kvc_begin(c, n, at, 2);
    kvc_snapshot_take(c, 0, KVC_POS_END, &s); /* aligned */
    kvc_snapshot_take(c, 0, n, &s);
    kvc_radix_commit(t, ns, c, tok, n, 0);
    kvc_radix_commit(t, ns, c, tok, n, 2);
    kvc_cache_trim(c, 1); kvc_cache_restore(c, NULL, 0); kvc_memory_trim(mem, 1); mp->lock(u); kvc_vk_pool_cmd_sync(p, cmd);
}
NEW
  # api_rename: end keep
  python3 tools/api_rename.py "$tmp/old.c" >/dev/null
  if cmp -s "$tmp/old.c" "$tmp/new.c"; then passed=$((passed + 1))
  else failed=$((failed + 1)); echo "tools/api_rename.py rewrote the sample wrongly:"; diff "$tmp/new.c" "$tmp/old.c"; fi
  if python3 tools/api_rename.py --check "$tmp/old.c" >/dev/null; then passed=$((passed + 1))
  else failed=$((failed + 1)); echo "tools/api_rename.py: a second run changes the sample again"; fi
  rm -rf "$tmp"
fi
echo "RESULT docs $passed $failed"
[ "$failed" = 0 ]
