#!/usr/bin/env bash
# shaders/embed.sh - the one place where what kvcache_vk.h and the shaders share is
# defined, and the build of the shaders:
#   - the lists below (shader modules, words of the attention job record, specialization
#     constant ids) are numbered in order and written twice: as GLSL #defines into
#     shaders/kvc_shared.glsl, and as C enums into kvcache_vk.h between its
#     BEGIN/END GENERATED SHARED NAMES markers;
#   - shaders/*.comp are compiled with glslc and their SPIR-V written into kvcache_vk.h
#     as uint32_t arrays, between its BEGIN/END GENERATED SPIR-V markers (the end of the
#     file), with the table the code reaches them through.
# So users of kvcache_vk.h never need glslc. `make shaders` runs this; tests/run.sh runs it
# on a copy of the header and fails if the result differs from the committed one.
#   usage: shaders/embed.sh [header]   (default: kvcache_vk.h)
# Modules built with -DKHR=1 use VK_KHR_cooperative_matrix and VK_NV_cooperative_matrix2,
# which need glslang 15 or later (Debian 12's glslc is 2023.2): GLSLANG=path/to/glslang
# compiles them (Vulkan 1.3 SPIR-V). Without it their SPIR-V is kept from the header, if the
# sources it was built from are unchanged: each such array carries the sha256 of its
# preprocessed source (glslc -E, without #line directives and blanks), and a changed source
# without GLSLANG is an error.
set -eu
cd "$(dirname "$0")/.."
out=${1:-kvcache_vk.h}
GLSLC=${GLSLC:-glslc}
GLSLANG=${GLSLANG:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Shader modules: name, source, defines. The C enum kvc_vk__module follows this order.
# (-O0: without spirv-opt; the NVIDIA driver 580 crashes on attn_split_cm's optimised SPIR-V)
modules="attn_split_sg attn_split.comp -DUSE_SUBGROUP=1
attn_split attn_split.comp -DUSE_SUBGROUP=0
attn_split_sg_dot attn_split.comp -DUSE_SUBGROUP=1 -DUSE_DOT=1
attn_merge attn_merge.comp -DUSE_SUBGROUP=0
attn_merge_sg attn_merge.comp -DUSE_SUBGROUP=1
rows_write rows_write.comp
rows_read rows_read.comp
copy copy.comp
attn_split_cm attn_split_cm.comp -O0
attn_split_qcm attn_split_cm.comp -O0 -DQUANT=1
attn_split_qcm_i8 attn_split_cm.comp -O0 -DQUANT=1 -DIK=1
attn_split_q attn_split_q.comp -DUSE_SUBGROUP=0
attn_split_q_dot attn_split_q.comp -DUSE_SUBGROUP=0 -DUSE_DOT=1
attn_split_q_sg attn_split_q.comp -DUSE_SUBGROUP=1
attn_split_q_sg_dot attn_split_q.comp -DUSE_SUBGROUP=1 -DUSE_DOT=1
rotate rotate.comp
attn_prefill attn_prefill.comp -DUSE_CM=0
attn_prefill_cm attn_prefill.comp -DUSE_CM=1 -O0
cm_layout cm_layout.comp -O0
half_exact half_exact.comp
attn_merge_rows attn_merge_rows.comp
attn_prefill_khr attn_prefill.comp -DUSE_CM=1 -DKHR=1
cm_layout_khr cm_layout.comp -DKHR=1"

# The attention job record: one query of one cache, as kvcache_vk.h writes it into the
# meta buffer and attn_common.glsl's load_job reads it, one 32-bit word per field.
# kind 0 (FULL/ROTATING) walks token ranges, kind 1 (CAUSAL) a cell range.
job_words="kind 0: FULL/ROTATING (token ranges), 1: CAUSAL (cell range), 2: CAUSAL with every cell of the range visible
n_view cells the job may read
b0 kind 0: first token of the sinks range [b0, e0)
e0 kind 0: end of the sinks range
b1 kind 0: first token of the recent range [b1, e1); kind 1: first cell
e1 kind 0: end of the recent range; kind 1: end of the cell range
pt_off meta word of the page table (kind 0: logical pages [0, nsink), then from lp_base)
nsink kind 0: logical pages of the sinks
lp_base kind 0: first logical page of the recent range
qpos the query's position
qseq the query's sequence
nc nonzero: the query is non-causal (it may see later positions)
win the query's sliding window (0: none)
sinks ROTATING: sink tokens
recent ROTATING: the recent window (0: not rotating)
cwin CAUSAL: the cache's sliding window
chunk CAUSAL: the cache's attention chunk (0: none)
cpos_off CAUSAL: meta word of the cells' positions
cseq_off CAUSAL: meta word of the cells' sequence bit sets
seq_words CAUSAL: words of one cell's sequence bit set
q_off first float of the query in the q buffer
out_off first float of the output in the out buffer
sink_off meta word of the query heads' sinks (f32 bits; ~0u: none)
lse_off first float of the query's log-sum-exps in the lse buffer (~0u: none)"

# Specialization constant ids, per shader (attn_split_cm.comp takes attn_split's ids).
spec_split="TYPE_K storage type of K (kvc_type)
TYPE_V storage type of V
HDK head dim of K
HDV head dim of V
G query heads per kv head (the GQA group)
SEGK key values decoded at a time (divides HDK)
EVT output values per invocation (divides HDV)
KV_HEADS kv heads
WG cells per block: the workgroup size
PAGE_CELLS cells per page
VQ nonzero: q8_0 / q4_0 V rows summed 8 values of every head at a time
GH attn_split_q.comp: query heads per workgroup
ROT_K rotated keys: the rotation's block, q rotated as it is loaded (0: none)
FUSED nonzero: one dispatch, the last workgroup of a head group merges (attn_onedisp.glsl)
REGS attn_split_cm.comp: the softmax on the elements of S^T in registers, in the layout kvc_vk__probe_cm_layout checked
HALF q8_0 / q4_0 block scales by unpackHalf2x16, which kvc_vk__probe_halves found exact on f16 subnormals"
spec_prefill="HDK head dim of K
HDV head dim of V
G query heads per kv head (the GQA group)
KV_HEADS kv heads
PAGE_CELLS cells per page"
spec_merge="HDV head dim of V
N_HEADS query heads
HDK head dim of K (the query rows checked for a NaN or an infinity)
ROT_V rotated values: the rotation's block, the output rotated back before it is written (0: none)
SG attn_merge_sg: the subgroup size R^T runs in, in registers (0: attn_merge, in shared memory)"
spec_rows_read="TYPE storage type of the tensor
HD head dim of the tensor
PLANAR nonzero: q8_0 / q4_0 pages in the planar layout
KV_HEADS kv heads (planar)
PAGE_CELLS cells per page (planar)"
spec_rows_write="TYPE storage type of the tensor
PLANAR nonzero: q8_0 / q4_0 pages in the planar layout
HD head dim of the tensor
KV_HEADS kv heads
PAGE_CELLS cells per page (planar)"
spec_rotate="HD head dim of the vectors
N the storage rotation's block (kvc_rotation_block)"

upper() { tr 'a-z' 'A-Z'; }
# glsl_defines PREFIX SUFFIX LIST: "#define PREFIX_NAME iSUFFIX // comment" for each line, in
# order (SUFFIX u: a uint; none for constant_id, which takes an int)
glsl_defines() {
  echo "$3" | awk -v p="$1" -v u="$2" '{ n = $1; $1 = ""; sub(/^ /, ""); printf "#define %s_%s %d%s // %s\n", p, toupper(n), NR - 1, u, $0 }'
}
# c_enum NAME PREFIX LIST: "enum NAME { KVC_VK__PREFIX_NAME = i, /* comment */ ... };"
c_enum() {
  echo "enum $1 {"
  echo "$3" | awk -v p="$2" '{ n = $1; $1 = ""; sub(/^ /, ""); printf "    KVC_VK__%s_%s = %d, /* %s */\n", p, toupper(n), NR - 1, $0 }'
  echo "    KVC_VK__${2}_COUNT = $(echo "$3" | wc -l)"
  echo "};"
}
n_job_words=$(echo "$job_words" | wc -l)
job_stride=$(( (n_job_words + 7) / 8 * 8 ))

{
  echo "// kvc_shared.glsl - generated by shaders/embed.sh from its lists: what the shaders share"
  echo "// with kvcache_vk.h (which holds the same names as C enums). Edit the lists there."
  echo "#ifndef KVC_SHARED_GLSL"
  echo "#define KVC_SHARED_GLSL"
  echo ""
  echo "// the words of the attention job record (attn_common.glsl's Job)"
  glsl_defines JOB u "$job_words"
  echo "#define JOB_STRIDE ${job_stride}u // words from one job record to the next (a multiple of 8)"
  echo ""
  echo "// specialization constant ids of attn_split.comp, attn_split_cm.comp and attn_split_q.comp"
  glsl_defines SPLIT "" "$spec_split"
  echo "// of attn_prefill.comp"
  glsl_defines PREFILL "" "$spec_prefill"
  echo "// of attn_merge.comp"
  glsl_defines MERGE "" "$spec_merge"
  echo "// of rows_read.comp"
  glsl_defines ROWS_READ "" "$spec_rows_read"
  echo "// of rows_write.comp"
  glsl_defines ROWS_WRITE "" "$spec_rows_write"
  echo "// of rotate.comp"
  glsl_defines ROTATE "" "$spec_rotate"
  echo "#endif"
} > "$tmp/kvc_shared.glsl"
cmp -s "$tmp/kvc_shared.glsl" shaders/kvc_shared.glsl || cp "$tmp/kvc_shared.glsl" shaders/kvc_shared.glsl

{
  echo "/* BEGIN GENERATED SHARED NAMES */"
  echo "/* shader modules (the SPIR-V at the end of the file) */"
  echo "typedef enum kvc_vk__module {"
  echo "$modules" | while read -r name src defs; do
    echo "    KVC_VK__MODULE_$(echo "$name" | upper), /* $src ${defs:-} */" | sed 's/  \*\//\ *\//'
  done
  echo "    KVC_VK__MODULE_COUNT"
  echo "} kvc_vk__module;"
  echo "/* the words of the attention job record (attn_common.glsl's Job) */"
  c_enum kvc_vk__job_word JOB "$job_words"
  echo "#define KVC_VK__JOB_STRIDE ${job_stride} /* words from one job record to the next (a multiple of 8) */"
  echo "/* specialization constant ids: attn_split.comp, attn_split_cm.comp and attn_split_q.comp */"
  c_enum kvc_vk__spec_split SPLIT "$spec_split"
  echo "/* attn_prefill.comp */"
  c_enum kvc_vk__spec_prefill PREFILL "$spec_prefill"
  echo "/* attn_merge.comp */"
  c_enum kvc_vk__spec_merge MERGE "$spec_merge"
  echo "/* rows_read.comp */"
  c_enum kvc_vk__spec_rows_read ROWS_READ "$spec_rows_read"
  echo "/* rows_write.comp */"
  c_enum kvc_vk__spec_rows_write ROWS_WRITE "$spec_rows_write"
  echo "/* rotate.comp */"
  c_enum kvc_vk__spec_rotate ROTATE "$spec_rotate"
  echo "/* END GENERATED SHARED NAMES */"
} > "$tmp/names"

# A -DKHR=1 module's SPIR-V as decimal words into $tmp/NAME.num, and its comment line (the
# compiler, the sources' hash) into $tmp/NAME.about: compiled with $GLSLANG, or kept from $out
khr_module() {
  local name=$1 src=$2 defs=$3 hash about
  hash=$(${GLSLC} -E -Ishaders $defs "shaders/$src" | grep -v '^#line' | tr -d ' \t\n' | sha256sum | cut -c1-64)
  if [ -n "$GLSLANG" ]; then
    "$GLSLANG" -V --target-env vulkan1.3 -Ishaders $defs "shaders/$src" -o "$tmp/$name.spv" > "$tmp/$name.log" 2>&1 ||
      { cat "$tmp/$name.log" >&2; exit 1; }
    od -An -tu4 -v "$tmp/$name.spv" | tr -s ' \n' ',' > "$tmp/$name.num"
    echo "/* $name: $("$GLSLANG" --version | head -n 1), sources sha256 $hash */" > "$tmp/$name.about"
    return
  fi
  about=$(grep "^/\* $name: .*, sources sha256 [0-9a-f]* \*/\$" "$out" || true)
  case "$about" in
    *"sources sha256 $hash */") ;;
    *) echo "embed.sh: $name's sources changed (or it is new): set GLSLANG to glslang 15 or later" >&2; exit 1 ;;
  esac
  echo "$about" > "$tmp/$name.about"
  awk -v start="static const uint32_t kvc_vk__spv_${name}[] = {" '
    $0 == start { on = 1; next } on && $0 == "};" { exit } on { print }' "$out" > "$tmp/$name.num"
}

{
  echo "/* BEGIN GENERATED SPIR-V */"
  echo "/* $(${GLSLC} --version 2>/dev/null | head -n 1); generated by shaders/embed.sh from the shaders folder */"
  echo "$modules" | while read -r name src defs; do
    case " ${defs:-} " in
      *" -DKHR=1 "*) khr_module "$name" "$src" "$defs"; cat "$tmp/$name.about" ;;
      *) ${GLSLC} --target-env=vulkan1.1 -O -Ishaders ${defs:-} "shaders/$src" -mfmt=num -o "$tmp/$name.num" ;;
    esac
    echo "static const uint32_t kvc_vk__spv_${name}[] = {"
    tr -d ' \n' < "$tmp/$name.num" | tr ',' '\n' | grep -v '^$' | paste -sd ',,,,,,,\n' | sed 's/^/    /; s/$/,/'
    echo "};"
  done
  echo "/* in kvc_vk__module's order */"
  echo "static const kvc_vk__spirv_code kvc_vk__spirv_table[KVC_VK__MODULE_COUNT] = {"
  echo "$modules" | while read -r name src defs; do
    echo "    {kvc_vk__spv_${name}, sizeof(kvc_vk__spv_${name}) / 4},"
  done
  echo "};"
  echo "/* END GENERATED SPIR-V */"
} > "$tmp/spirv"

for m in "BEGIN GENERATED SHARED NAMES" "END GENERATED SHARED NAMES" "BEGIN GENERATED SPIR-V" "END GENERATED SPIR-V"; do
  grep -qx "/\* $m \*/" "$out" || { echo "embed.sh: $out has no /* $m */ line" >&2; exit 1; }
done
awk -v names="$tmp/names" -v spirv="$tmp/spirv" '
  /^\/\* BEGIN GENERATED SHARED NAMES \*\/$/ { while ((getline line < names) > 0) print line; skip = 1; next }
  /^\/\* END GENERATED SHARED NAMES \*\/$/ { skip = 0; next }
  /^\/\* BEGIN GENERATED SPIR-V \*\/$/ { while ((getline line < spirv) > 0) print line; skip = 1; next }
  /^\/\* END GENERATED SPIR-V \*\/$/ { skip = 0; next }
  !skip { print }' "$out" > "$tmp/header"
cp "$tmp/header" "$out"
