#!/usr/bin/env python3
"""tools/api_rename.py - bring C code and documents up to kvcache.h's current API names.

    python3 tools/api_rename.py [--dry-run] [--check] [PATH ...]

PATH: files or directories (default: the repository this script lives in). Every .c, .h,
.cc, .cpp, .hpp, .md, .sh, .py and .glsl file under a directory is rewritten in place
(.git, build/ and this script skipped; kvcache_vk.h's generated SPIR-V block,
CHANGELOG.md's release history and rename table, and text between the markers
"api_rename: keep" and "api_rename: end keep" are left alone). It prints one line per
file it changes with the number of edits of each kind, and a total. --dry-run changes
nothing; --check changes nothing and exits 1 when something would change (CI: nothing
left to migrate). Running it twice changes nothing the second time.

What it does (the CHANGELOG's "Renamed" table of the release that made the change):
  1. renames: whole identifiers only (kvc_trim -> kvc_cache_trim leaves kvc_memory_trim);
  2. folds of parallel calls into one call with one more argument, decided at each call
     by its number of arguments (parentheses, brackets and braces balanced), so a call
     already in the new form is left as it is:
        kvc_begin(c, n)                      -> kvc_begin(c, n, NULL, 0)
        kvc_begin_checkpoints(c, n, at, k)   -> kvc_begin(c, n, at, k)
        kvc_snapshot_take(c, from, &s)       -> kvc_snapshot_take(c, from, KVC_POS_END, &s)
        kvc_snapshot_take_at(c, from, at, &s)-> kvc_snapshot_take(c, from, at, &s)
        kvc_radix_commit(t, ns, c, tok, n)   -> kvc_radix_commit(t, ns, c, tok, n, 0)
        kvc_radix_commit_priority(...)       -> kvc_radix_commit(...)
  3. the runtime block: the fields that kvc_pool_config and kvc_memory_config share
     (allocator, cpu_disable, parallel_for, parallel_user, n_workers, lock, unlock,
     lock_user) moved into their `runtime` member (kvc_runtime):
        cfg.allocator -> cfg.runtime.allocator, m->lock -> m->runtime.lock, and the
        documents' kvc_pool_config.lock -> kvc_pool_config.runtime.lock; the field
        names the config checks report ("lock" -> "runtime.lock", on lines about a
        refused field);
        kvc_threads_attach(t, &cfg) -> kvc_threads_attach(t, &cfg.runtime) (and
        kvc_mutex_attach). A member access is rewritten when its base is a variable the
        same file declares as a kvc_pool_config / kvc_memory_config (or a pointer to
        one), a group config's `.pool`, or a kvc_pool's `cfg`; anything else is left
        alone and the compiler names what was missed.
Spellings it cannot know (a function pointer to a folded call, a macro wrapping one) are
left for the compiler to report.
"""
import os
import re
import sys

RENAMES = [
    # kvcache.h: a cache operation names its object (kvc_<object>_<verb>)
    ("kvc_trim", "kvc_cache_trim"),
    ("kvc_can_trim", "kvc_cache_can_trim"),
    ("kvc_restore", "kvc_cache_restore"),
    ("kvc_can_rewind", "kvc_cache_can_rewind"),
    ("kvc_checkpoints", "kvc_cache_checkpoints"),
    ("kvc_defrag", "kvc_cache_defrag"),
    # folds (the arity rules below make the argument lists match)
    ("kvc_begin_checkpoints", "kvc_begin"),
    ("kvc_snapshot_take_at", "kvc_snapshot_take"),
    ("kvc_radix_commit_priority", "kvc_radix_commit"),
    # kvcache_vk.h: the pool's calls name the pool, as the memory's do
    ("kvc_vk_cmd_sync", "kvc_vk_pool_cmd_sync"),
    ("kvc_vk_cmd_trim", "kvc_vk_pool_cmd_trim"),
    ("kvc_vk_begin", "kvc_vk_context_begin"),
    ("kvc_vk_submit_wait", "kvc_vk_context_submit_wait"),
    ("kvc_vk_upload", "kvc_vk_buffer_upload"),
    ("kvc_vk_download", "kvc_vk_buffer_download"),
]

# name, the old number of arguments, (index, text) inserted to reach the new form
FOLDS = [
    ("kvc_begin", 2, [(2, "NULL"), (3, "0")]),
    ("kvc_snapshot_take", 3, [(2, "KVC_POS_END")]),
    ("kvc_radix_commit", 5, [(5, "0")]),
]

RUNTIME_FIELDS = ["allocator", "cpu_disable", "parallel_for", "parallel_user", "n_workers",
                  "lock_user", "lock", "unlock"]
CONFIG_TYPES = ("kvc_pool_config", "kvc_memory_config")

EXTENSIONS = (".c", ".h", ".cc", ".cpp", ".hpp", ".md", ".sh", ".py", ".glsl")
SKIP_DIRS = {".git", "build", ".gl", "node_modules"}
SELF = os.path.abspath(__file__)


def split_args(text, open_at):
    """text[open_at] == '('. Returns (end, [(start, stop) of each argument]) with end
    just past the matching ')', or None when it does not close (prose, a cut-off line)."""
    depth, i, start, args = 0, open_at, open_at + 1, []
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack = []
    while i < len(text):
        ch = text[i]
        if ch in "\"'" and depth > 0:  # a string or character literal inside the call
            j = i + 1
            while j < len(text) and text[j] != ch:
                j += 2 if text[j] == "\\" else 1
                if text[j - 1] == "\n":
                    return None
            i = j + 1
            continue
        if ch in pairs:
            stack.append(pairs[ch])
            depth += 1
        elif ch in ")]}":
            if not stack or stack[-1] != ch:
                return None
            stack.pop()
            depth -= 1
            if depth == 0:
                args.append((start, i))
                if len(args) == 1 and text[start:i].strip() == "":
                    args = []
                return i + 1, args
        elif ch == "," and depth == 1:
            args.append((start, i))
            start = i + 1
        elif ch == ";" and depth > 0:
            return None
        i += 1
    return None


def fold_calls(text, name, old_arity, inserts):
    pat = re.compile(r"\b%s\(" % re.escape(name))  # no space: prose "kvc_begin (and ...)" is no call
    out, pos, n = [], 0, 0
    for m in pat.finditer(text):
        if m.start() < pos:
            continue
        line_start = text.rfind("\n", 0, m.start()) + 1
        before = text[line_start:m.start()]
        if re.search(r"(kvc_result|void|int|\*)\s*$", before):  # a declaration
            continue
        parsed = split_args(text, m.end() - 1)
        if parsed is None:
            continue
        end, args = parsed
        if len(args) != old_arity:
            continue
        pieces = [text[a:b] for a, b in args]
        for index, new in inserts:
            pieces.insert(index, " " + new if index > 0 else new)
        out.append(text[pos:m.end()])
        out.append(",".join(pieces))
        out.append(")")
        pos, n = end, n + 1
    out.append(text[pos:])
    return "".join(out), n


def config_names(text):
    """Variables (and parameters) this file declares as a pool or memory config:
    `kvc_pool_config cfg, bad;`, `const kvc_memory_config *m`, `kvc_pool_config pc = {0}`."""
    names = set()
    decl = re.compile(r"\s*\**\s*(?:const\s+)?([A-Za-z_]\w*)\s*(\[[^\]\n]*\]\s*)*")
    for m in re.finditer(r"\b(?:%s)\b(?!\s*[.(])" % "|".join(CONFIG_TYPES), text):
        i = m.end()
        while True:
            d = decl.match(text, i)
            if d is None:
                break
            names.add(d.group(1))
            i = d.end()
            if i < len(text) and text[i] == "=":  # skip the initializer
                depth = 0
                while i < len(text) and not (depth == 0 and text[i] in ",;)"):
                    depth += text[i] in "({[" and 1 or (text[i] in ")}]" and -1 or 0)
                    i += 1
            if i < len(text) and text[i] == ",":
                nxt = decl.match(text, i + 1)  # another declarator, or a parameter's type?
                if nxt is None or (nxt.end() < len(text) and re.match(r"[A-Za-z_*]", text[nxt.end()])):
                    break
                i += 1
                continue
            break
    return names - {"const", "struct"}


def move_runtime(text):
    n = 0
    fields = "|".join(RUNTIME_FIELDS)
    # documents: kvc_pool_config.lock, kvc_memory_config.n_workers
    text, k = re.subn(r"\b(%s)\.(%s)\b" % ("|".join(CONFIG_TYPES), fields), r"\1.runtime.\2", text)
    n += k
    names = config_names(text)
    # a group config's pool, a kvc_pool's cfg: `.pool.lock`, `->cfg.allocator`
    bases = sorted(names | {"pool", "cfg"}, key=len, reverse=True)
    if bases:
        pat = re.compile(r"(?<![\w.>])((?:[A-Za-z_]\w*(?:\[[^\]\n]*\])?(?:\.|->))*?(?:%s)(?:\[[^\]\n]*\])?)(\.|->)(%s)\b"
                         % ("|".join(re.escape(b) for b in bases), fields))

        def repl(m):
            base = m.group(1)
            last = re.split(r"\.|->", base)[-1]
            last = re.sub(r"\[.*", "", last)
            if last == "runtime":
                return m.group(0)
            if last == "pool" and not re.search(r"(\.|->)pool$", re.sub(r"\[[^\]]*\]$", "", base)) and "pool" not in names:
                return m.group(0)  # a variable called pool (a kvc_pool *, say), not a group's .pool
            if last == "cfg" and "cfg" not in names and not re.search(r"(\.|->)cfg$", base):
                return m.group(0)
            return "%s%sruntime.%s" % (base, m.group(2), m.group(3))

        text, k = pat.subn(repl, text)
        n += k
    # the field names kvc_pool_config_check / kvc_memory_config_check report: a literal
    # "lock" on a line about a refused field (field, want, wf, KVC__REFUSE, runtime.)
    lines, k = text.split("\n"), 0
    for i, line in enumerate(lines):
        if '"' in line and re.search(r"\bfield\b|\bwant\b|\bwf\b|KVC__REFUSE|runtime\.", line):
            lines[i], c = re.subn(r'"(%s)"' % fields, r'"runtime.\1"', line)
            k += c
    text, n = "\n".join(lines), n + k
    # the attach helpers take the runtime block
    for fn in ("kvc_threads_attach", "kvc_mutex_attach"):
        out, pos = [], 0
        for m in re.finditer(r"\b%s\(" % fn, text):
            if m.start() < pos:
                continue
            parsed = split_args(text, m.end() - 1)
            if parsed is None:
                continue
            end, args = parsed
            if len(args) != 2:
                continue
            a, b = args[1]
            arg = text[a:b].strip()
            if "runtime" in arg or re.search(r"\b(kvc_\w+_config|kvc_runtime)\b", arg) or arg in ("NULL", "cfg)"):
                continue
            lead = text[a:b][:len(text[a:b]) - len(text[a:b].lstrip())]
            if arg.startswith("&") and re.fullmatch(r"&[\w.\[\]>-]+", arg):
                new = arg + ".runtime"
            elif re.fullmatch(r"[\w.\[\]>-]+", arg):
                new = "&" + arg + "->runtime"
            else:
                new = "&(" + arg + ")->runtime"
            out.append(text[pos:a])
            out.append(lead + new)
            pos = b
            n += 1
        out.append(text[pos:])
        text = "".join(out)
    return text, n


def rewrite(text):
    counts = {}
    for old, new in RENAMES:
        text, k = re.subn(r"\b%s\b" % re.escape(old), new, text)
        if k:
            counts["rename " + old] = k
    for name, arity, inserts in FOLDS:
        text, k = fold_calls(text, name, arity, inserts)
        if k:
            counts["fold %s/%d" % (name, arity)] = k
    text, k = move_runtime(text)
    if k:
        counts["runtime fields"] = k
    return text, counts


def realign(old, new):
    """Keep trailing comments where they were: a line that grew pushes its `/*` or `//`
    right; take the growth back out of the spaces before it (at least one left)."""
    old_lines, new_lines = old.split("\n"), new.split("\n")
    if len(old_lines) != len(new_lines):
        return new
    for i, (a, b) in enumerate(zip(old_lines, new_lines)):
        if a == b:
            continue
        ca, cb = re.search(r"\S( {2,})(/\*|//)", a), re.search(r"\S( {2,})(/\*|//)", b)
        if ca is None or cb is None or cb.start(2) <= ca.start(2):
            continue
        spaces = max(1, len(cb.group(1)) - (cb.start(2) - ca.start(2)))
        new_lines[i] = b[:cb.start(1)] + " " * spaces + b[cb.start(2):]
    return "\n".join(new_lines)


def protected_spans(path, text):
    """Parts of a file never rewritten: generated SPIR-V, CHANGELOG history and tables."""
    spans = []
    base = os.path.basename(path)
    b = text.find("/* BEGIN GENERATED SPIR-V */")
    e = text.find("/* END GENERATED SPIR-V */")
    if b >= 0 and e > b:
        spans.append((b, e))
    for m in re.finditer(r"api_rename: keep\b.*?api_rename: end keep", text, re.S):
        spans.append((m.start(), m.end()))  # e.g. the old spellings of a test's sample
    if base == "CHANGELOG.md":
        heads = [m.start() for m in re.finditer(r"(?m)^## ", text)]
        if len(heads) >= 2:
            spans.append((heads[1], len(text)))  # every release below "Unreleased"
        for m in re.finditer(r"(?m)^\|.*\n", text):  # the rename tables: old -> new
            spans.append((m.start(), m.end()))
        for m in re.finditer(r"(?m)^.*api_rename.*\n", text):
            spans.append((m.start(), m.end()))
    return sorted(spans)


def process(path, write):
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        text = f.read()
    if "kvc_" not in text:
        return {}
    spans = protected_spans(path, text)
    pieces, pos, counts = [], 0, {}
    for b, e in spans + [(len(text), len(text))]:
        if b < pos:
            continue
        new, c = rewrite(text[pos:b])
        new = realign(text[pos:b], new)
        pieces.append(new)
        pieces.append(text[b:e])
        for key, v in c.items():
            counts[key] = counts.get(key, 0) + v
        pos = e
    new_text = "".join(pieces)
    if new_text == text:
        return {}
    if write:
        with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(new_text)
    return counts


def files_under(root):
    if os.path.isfile(root):
        yield root
        return
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS)
        for name in sorted(files):
            p = os.path.join(d, name)
            if name.endswith(EXTENSIONS) and os.path.abspath(p) != SELF:
                yield p


def main(argv):
    write, check, roots = True, False, []
    for a in argv:
        if a == "--dry-run":
            write = False
        elif a == "--check":
            write, check = False, True
        elif a in ("-h", "--help"):
            print(__doc__.strip())
            return 0
        else:
            roots.append(a)
    if not roots:
        roots = [os.path.dirname(os.path.dirname(SELF))]
    total, changed = 0, 0
    for root in roots:
        if not os.path.exists(root):
            print("api_rename: no such file or directory: %s" % root, file=sys.stderr)
            return 2
        for p in files_under(root):
            counts = process(p, write)
            if counts:
                changed += 1
                total += sum(counts.values())
                print("%s: %s" % (p, ", ".join("%s x%d" % kv for kv in sorted(counts.items()))))
    verb = "would change" if not write else "changed"
    print("api_rename: %s %d edits in %d files" % (verb, total, changed))
    return 1 if check and changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
