/* probe_vk_products.c - how fast the device's workgroup-scope cooperative matrices
   (VK_NV_cooperative_matrix2) run flash attention's products, with nothing else in the loop.

   Issue 37 (round 20) asked whether prefill can reach 0.8x of SDPA's flash kernel. This probe
   gives the driver the whole tiling: each workgroup holds Q (BR x 128) and, per iteration,
   loads K^T (128 x BC) and V (BC x 128) from a 2 MB buffer (L2-resident), S = Q K^T,
   P = f16(S / 1000), O += P V, no softmax. Its TFLOP/s is what the driver's own tiling of the
   products reaches; `tools/nv_sass.py` and `nvdisasm` on the pipeline show which instructions
   it chose (on the H200 with driver 580: HMMA.16816, mma.sync's, and no HGMMA: Hopper's
   wgmma is not reached from Vulkan). docs/performance-log.md has the round's figures.

   Build (Vulkan headers and loader; the shader needs glslang 15 or later, see docs/design.md):
     cc -std=c99 -O2 bench/probe_vk_products.c -o build/probe_vk_products -lvulkan
     glslang -V --target-env vulkan1.3 -DBR=128 -DBC=64 -DWG=256 \
         bench/probe_vk_products.comp -o build/p128x64.spv
     build/probe_vk_products build/p128x64.spv:128,64
   Each argument is a SPIR-V file and, after a colon, the BR,BC it was built with (for the
   FLOP count). PROBE_GROUPS sets the workgroups (default 264: two per multiprocessor of an
   H200). Prints the device's cooperativeMatrix2 features, then per file the median of 7
   timed dispatches and the pipeline's statistics (registers, shared memory, code size). */
#include <vulkan/vulkan.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* VK_NV_cooperative_matrix2 and VK_KHR_cooperative_matrix, declared here for headers older
   than them (Debian 12's are 1.3.239), as kvcache_vk.h does */
typedef struct probe_matrix2_features {
    VkStructureType sType;
    void *pNext;
    VkBool32 workgroupScope, flexibleDimensions, reductions, conversions, perElementOperations, tensorAddressing,
        blockLoads;
} probe_matrix2_features;
typedef struct probe_matrix2_props {
    VkStructureType sType;
    void *pNext;
    uint32_t workgroupScopeMaxWorkgroupSize, flexibleDimensionsMaxDimension, workgroupScopeReservedSharedMemory;
} probe_matrix2_props;
typedef struct probe_matrix_features {
    VkStructureType sType;
    void *pNext;
    VkBool32 cooperativeMatrix, robustBufferAccess;
} probe_matrix_features;
#define PROBE_STYPE_MATRIX_FEATURES ((VkStructureType)1000506000)
#define PROBE_STYPE_MATRIX2_FEATURES ((VkStructureType)1000593000)
#define PROBE_STYPE_MATRIX2_PROPS ((VkStructureType)1000593002)

#define ITERS 256u  /* iterations a workgroup */
#define NTILES 64u  /* K / V tiles of 128 x 128 halves in the buffers */
#define REPS 7

static VkPhysicalDevice g_pd;
static VkDevice g_dev;

static void check(VkResult r, const char *what) {
    if (r != VK_SUCCESS) {
        fprintf(stderr, "probe_vk_products: %s failed (%d)\n", what, (int)r);
        exit(1);
    }
}

static uint32_t memory_type(uint32_t bits, VkMemoryPropertyFlags want) {
    VkPhysicalDeviceMemoryProperties mp;
    uint32_t i;
    vkGetPhysicalDeviceMemoryProperties(g_pd, &mp);
    for (i = 0; i < mp.memoryTypeCount; ++i)
        if ((bits >> i & 1u) && (mp.memoryTypes[i].propertyFlags & want) == want) return i;
    fprintf(stderr, "probe_vk_products: no memory type\n");
    exit(1);
}

/* a storage buffer: device-local, or host-visible and mapped where map is given */
static VkBuffer make_buffer(VkDeviceSize n, VkDeviceMemory *mem, void **map) {
    VkBufferCreateInfo bi;
    VkMemoryAllocateInfo ai;
    VkMemoryRequirements req;
    VkBuffer b;
    memset(&bi, 0, sizeof bi);
    bi.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
    bi.size = n;
    bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    check(vkCreateBuffer(g_dev, &bi, NULL, &b), "vkCreateBuffer");
    vkGetBufferMemoryRequirements(g_dev, b, &req);
    memset(&ai, 0, sizeof ai);
    ai.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
    ai.allocationSize = req.size;
    ai.memoryTypeIndex = memory_type(req.memoryTypeBits, map ? VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                                                   VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
                                                             : VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
    check(vkAllocateMemory(g_dev, &ai, NULL, mem), "vkAllocateMemory");
    check(vkBindBufferMemory(g_dev, b, *mem, 0), "vkBindBufferMemory");
    if (map) check(vkMapMemory(g_dev, *mem, 0, n, 0, map), "vkMapMemory");
    return b;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* the SPIR-V file's words, or NULL */
static uint32_t *read_spirv(const char *path, size_t *bytes) {
    FILE *f = fopen(path, "rb");
    uint32_t *code = NULL;
    long n;
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 && n % 4 == 0 && fseek(f, 0, SEEK_SET) == 0) {
        code = (uint32_t *)malloc((size_t)n);
        if (code && fread(code, 1, (size_t)n, f) != (size_t)n) {
            free(code);
            code = NULL;
        }
        *bytes = (size_t)n;
    }
    fclose(f);
    return code;
}

/* the pipeline's statistics, "name=value ..." (VK_KHR_pipeline_executable_properties) */
static void statistics(VkPipeline p, char *out, size_t cap) {
    PFN_vkGetPipelineExecutableStatisticsKHR get =
        (PFN_vkGetPipelineExecutableStatisticsKHR)vkGetDeviceProcAddr(g_dev, "vkGetPipelineExecutableStatisticsKHR");
    VkPipelineExecutableInfoKHR ei;
    VkPipelineExecutableStatisticKHR st[32];
    uint32_t n = 32, i;
    out[0] = 0;
    if (!get) return;
    memset(&ei, 0, sizeof ei);
    ei.sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR;
    ei.pipeline = p;
    memset(st, 0, sizeof st);
    for (i = 0; i < n; ++i) st[i].sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR;
    if (get(g_dev, &ei, &n, st) < 0) return;
    for (i = 0; i < n; ++i) {
        size_t at = strlen(out);
        if (st[i].format == VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR && at < cap)
            snprintf(out + at, cap - at, " %s=%llu", st[i].name, (unsigned long long)st[i].value.u64);
    }
}

int main(int argc, char **argv) {
    VkApplicationInfo app;
    VkInstanceCreateInfo ii;
    VkInstance inst;
    VkPhysicalDeviceProperties pp;
    VkPhysicalDeviceProperties2 p2;
    probe_matrix2_props m2p;
    probe_matrix2_features m2f;
    probe_matrix_features mf;
    VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR pef;
    VkPhysicalDeviceVulkan13Features f13;
    VkPhysicalDeviceVulkan12Features f12;
    VkPhysicalDeviceVulkan11Features f11;
    VkPhysicalDeviceFeatures2 f2;
    VkQueueFamilyProperties qfp[16];
    VkDeviceQueueCreateInfo qi;
    VkDeviceCreateInfo di;
    const char *ext[] = {"VK_KHR_cooperative_matrix", "VK_NV_cooperative_matrix2", "VK_KHR_pipeline_executable_properties"};
    VkQueue queue;
    VkDeviceMemory mk, mv, mo, mh;
    VkBuffer bk, bv, bo, bh;
    VkDescriptorSetLayoutBinding lb[3];
    VkDescriptorSetLayoutCreateInfo lci;
    VkDescriptorSetLayout dsl;
    VkPushConstantRange pcr;
    VkPipelineLayoutCreateInfo plci;
    VkPipelineLayout layout;
    VkDescriptorPoolSize dps;
    VkDescriptorPoolCreateInfo dpci;
    VkDescriptorPool dpool;
    VkDescriptorSetAllocateInfo dsai;
    VkDescriptorSet set;
    VkDescriptorBufferInfo dbi[3];
    VkWriteDescriptorSet wds[3];
    VkCommandPoolCreateInfo cpci;
    VkCommandPool cpool;
    VkCommandBufferAllocateInfo cbai;
    VkCommandBuffer cmd;
    VkCommandBufferBeginInfo cbbi;
    VkQueryPoolCreateInfo qpci;
    VkQueryPool qpool;
    VkFenceCreateInfo fci;
    VkFence fence;
    VkSubmitInfo si;
    VkBufferCopy copy;
    const char *env = getenv("PROBE_GROUPS");
    uint32_t n_dev = 1, n_qf = 16, qf, groups = env ? (uint32_t)atoi(env) : 264u, i;
    float prio = 1.0f;
    VkDeviceSize kv_bytes = (VkDeviceSize)NTILES * 128 * 128 * 2, out_bytes;
    void *host;
    uint16_t *h;
    int a;

    if (argc < 2 || groups == 0) {
        fprintf(stderr, "usage: probe_vk_products FILE.spv:BR,BC ... (PROBE_GROUPS: workgroups, default 264)\n");
        return 2;
    }
    out_bytes = (VkDeviceSize)groups * 128 * 128 * 4;
    memset(&app, 0, sizeof app);
    app.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO;
    app.apiVersion = VK_API_VERSION_1_3;
    memset(&ii, 0, sizeof ii);
    ii.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
    ii.pApplicationInfo = &app;
    check(vkCreateInstance(&ii, NULL, &inst), "vkCreateInstance");
    if (vkEnumeratePhysicalDevices(inst, &n_dev, &g_pd) < 0 || n_dev == 0) check(VK_ERROR_INITIALIZATION_FAILED, "a device");
    vkGetPhysicalDeviceProperties(g_pd, &pp);
    memset(&m2p, 0, sizeof m2p);
    m2p.sType = PROBE_STYPE_MATRIX2_PROPS;
    memset(&p2, 0, sizeof p2);
    p2.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2;
    p2.pNext = &m2p;
    vkGetPhysicalDeviceProperties2(g_pd, &p2);

    /* every feature the device has, the matrices' among them, enabled as reported */
    memset(&m2f, 0, sizeof m2f);
    m2f.sType = PROBE_STYPE_MATRIX2_FEATURES;
    memset(&mf, 0, sizeof mf);
    mf.sType = PROBE_STYPE_MATRIX_FEATURES;
    mf.pNext = &m2f;
    memset(&pef, 0, sizeof pef);
    pef.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR;
    pef.pNext = &mf;
    memset(&f13, 0, sizeof f13);
    f13.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES;
    f13.pNext = &pef;
    memset(&f12, 0, sizeof f12);
    f12.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES;
    f12.pNext = &f13;
    memset(&f11, 0, sizeof f11);
    f11.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES;
    f11.pNext = &f12;
    memset(&f2, 0, sizeof f2);
    f2.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2;
    f2.pNext = &f11;
    vkGetPhysicalDeviceFeatures2(g_pd, &f2);
    printf("probe_vk_products: %s, Vulkan %u.%u; cooperativeMatrix2: workgroup scope %u (at most %u invocations, "
           "%u bytes of shared memory reserved), flexible dimensions %u (at most %u), reductions %u, conversions %u; "
           "%u workgroups of %u iterations, medians of %d\n",
           pp.deviceName, VK_VERSION_MAJOR(pp.apiVersion), VK_VERSION_MINOR(pp.apiVersion), m2f.workgroupScope,
           m2p.workgroupScopeMaxWorkgroupSize, m2p.workgroupScopeReservedSharedMemory, m2f.flexibleDimensions,
           m2p.flexibleDimensionsMaxDimension, m2f.reductions, m2f.conversions, groups, ITERS, REPS);
    if (!mf.cooperativeMatrix || !m2f.workgroupScope || !m2f.flexibleDimensions || !m2f.conversions) {
        printf("probe_vk_products: skipped (no workgroup-scope cooperative matrices)\n");
        vkDestroyInstance(inst, NULL);
        return 0;
    }

    vkGetPhysicalDeviceQueueFamilyProperties(g_pd, &n_qf, qfp);
    for (qf = 0; qf < n_qf && !(qfp[qf].queueFlags & VK_QUEUE_COMPUTE_BIT); ++qf) {}
    if (qf == n_qf) check(VK_ERROR_INITIALIZATION_FAILED, "a compute queue");
    memset(&qi, 0, sizeof qi);
    qi.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO;
    qi.queueFamilyIndex = qf;
    qi.queueCount = 1;
    qi.pQueuePriorities = &prio;
    memset(&di, 0, sizeof di);
    di.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
    di.pNext = &f2;
    di.queueCreateInfoCount = 1;
    di.pQueueCreateInfos = &qi;
    di.enabledExtensionCount = pef.pipelineExecutableInfo ? 3 : 2;
    di.ppEnabledExtensionNames = ext;
    check(vkCreateDevice(g_pd, &di, NULL, &g_dev), "vkCreateDevice");
    vkGetDeviceQueue(g_dev, qf, 0, &queue);

    /* K and V: random halves of magnitude 0.5-1 (exponents of 0x38xx-0x3bxx), either sign */
    bk = make_buffer(kv_bytes, &mk, NULL);
    bv = make_buffer(kv_bytes, &mv, NULL);
    bo = make_buffer(out_bytes, &mo, NULL);
    bh = make_buffer(kv_bytes, &mh, &host);
    h = (uint16_t *)host;
    srand(7);
    for (i = 0; i < kv_bytes / 2; ++i) h[i] = (uint16_t)((0x3800 + (rand() & 0x3ff)) | ((rand() & 1) << 15));

    memset(lb, 0, sizeof lb);
    for (i = 0; i < 3; ++i) {
        lb[i].binding = i;
        lb[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        lb[i].descriptorCount = 1;
        lb[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
    }
    memset(&lci, 0, sizeof lci);
    lci.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO;
    lci.bindingCount = 3;
    lci.pBindings = lb;
    check(vkCreateDescriptorSetLayout(g_dev, &lci, NULL, &dsl), "vkCreateDescriptorSetLayout");
    pcr.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
    pcr.offset = 0;
    pcr.size = 8;
    memset(&plci, 0, sizeof plci);
    plci.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO;
    plci.setLayoutCount = 1;
    plci.pSetLayouts = &dsl;
    plci.pushConstantRangeCount = 1;
    plci.pPushConstantRanges = &pcr;
    check(vkCreatePipelineLayout(g_dev, &plci, NULL, &layout), "vkCreatePipelineLayout");
    dps.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    dps.descriptorCount = 3;
    memset(&dpci, 0, sizeof dpci);
    dpci.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO;
    dpci.maxSets = 1;
    dpci.poolSizeCount = 1;
    dpci.pPoolSizes = &dps;
    check(vkCreateDescriptorPool(g_dev, &dpci, NULL, &dpool), "vkCreateDescriptorPool");
    memset(&dsai, 0, sizeof dsai);
    dsai.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO;
    dsai.descriptorPool = dpool;
    dsai.descriptorSetCount = 1;
    dsai.pSetLayouts = &dsl;
    check(vkAllocateDescriptorSets(g_dev, &dsai, &set), "vkAllocateDescriptorSets");
    dbi[0].buffer = bk;
    dbi[1].buffer = bv;
    dbi[2].buffer = bo;
    memset(wds, 0, sizeof wds);
    for (i = 0; i < 3; ++i) {
        dbi[i].offset = 0;
        dbi[i].range = VK_WHOLE_SIZE;
        wds[i].sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
        wds[i].dstSet = set;
        wds[i].dstBinding = i;
        wds[i].descriptorCount = 1;
        wds[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        wds[i].pBufferInfo = &dbi[i];
    }
    vkUpdateDescriptorSets(g_dev, 3, wds, 0, NULL);

    memset(&cpci, 0, sizeof cpci);
    cpci.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
    cpci.queueFamilyIndex = qf;
    cpci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    check(vkCreateCommandPool(g_dev, &cpci, NULL, &cpool), "vkCreateCommandPool");
    memset(&cbai, 0, sizeof cbai);
    cbai.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
    cbai.commandPool = cpool;
    cbai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cbai.commandBufferCount = 1;
    check(vkAllocateCommandBuffers(g_dev, &cbai, &cmd), "vkAllocateCommandBuffers");
    memset(&qpci, 0, sizeof qpci);
    qpci.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO;
    qpci.queryType = VK_QUERY_TYPE_TIMESTAMP;
    qpci.queryCount = 2;
    check(vkCreateQueryPool(g_dev, &qpci, NULL, &qpool), "vkCreateQueryPool");
    memset(&fci, 0, sizeof fci);
    fci.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
    check(vkCreateFence(g_dev, &fci, NULL, &fence), "vkCreateFence");
    memset(&cbbi, 0, sizeof cbbi);
    cbbi.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
    memset(&si, 0, sizeof si);
    si.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cmd;

    /* K and V into device memory */
    check(vkBeginCommandBuffer(cmd, &cbbi), "vkBeginCommandBuffer");
    copy.srcOffset = copy.dstOffset = 0;
    copy.size = kv_bytes;
    vkCmdCopyBuffer(cmd, bh, bk, 1, &copy);
    vkCmdCopyBuffer(cmd, bh, bv, 1, &copy);
    check(vkEndCommandBuffer(cmd), "vkEndCommandBuffer");
    check(vkQueueSubmit(queue, 1, &si, fence), "vkQueueSubmit");
    check(vkWaitForFences(g_dev, 1, &fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");
    check(vkResetFences(g_dev, 1, &fence), "vkResetFences");

    for (a = 1; a < argc; ++a) {
        char path[1024], stats[1024];
        char *colon;
        unsigned br = 64, bc = 64;
        size_t bytes = 0;
        uint32_t *code;
        VkShaderModuleCreateInfo smci;
        VkShaderModule sm;
        VkComputePipelineCreateInfo cpi;
        VkPipeline pipe;
        VkResult r;
        double us[REPS], flop;
        int rep;
        snprintf(path, sizeof path, "%s", argv[a]);
        colon = strrchr(path, ':');
        if (colon) {
            *colon = 0;
            if (sscanf(colon + 1, "%u,%u", &br, &bc) != 2) br = 64, bc = 64;
        }
        code = read_spirv(path, &bytes);
        if (!code) {
            printf("%s: cannot read\n", path);
            continue;
        }
        memset(&smci, 0, sizeof smci);
        smci.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO;
        smci.codeSize = bytes;
        smci.pCode = code;
        check(vkCreateShaderModule(g_dev, &smci, NULL, &sm), "vkCreateShaderModule");
        memset(&cpi, 0, sizeof cpi);
        cpi.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO;
        cpi.flags = pef.pipelineExecutableInfo ? VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR : 0;
        cpi.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
        cpi.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
        cpi.stage.module = sm;
        cpi.stage.pName = "main";
        cpi.layout = layout;
        r = vkCreateComputePipelines(g_dev, VK_NULL_HANDLE, 1, &cpi, NULL, &pipe);
        if (r != VK_SUCCESS) {
            printf("%s: no pipeline (%d)\n", path, (int)r);
            vkDestroyShaderModule(g_dev, sm, NULL);
            free(code);
            continue;
        }
        statistics(pipe, stats, sizeof stats);
        for (rep = 0; rep < REPS; ++rep) {
            uint32_t pc[2] = {ITERS, NTILES};
            uint64_t ts[2];
            check(vkResetCommandBuffer(cmd, 0), "vkResetCommandBuffer");
            check(vkBeginCommandBuffer(cmd, &cbbi), "vkBeginCommandBuffer");
            vkCmdResetQueryPool(cmd, qpool, 0, 2);
            vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
            vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, layout, 0, 1, &set, 0, NULL);
            vkCmdPushConstants(cmd, layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof pc, pc);
            vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, qpool, 0);
            vkCmdDispatch(cmd, groups, 1, 1);
            vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, qpool, 1);
            check(vkEndCommandBuffer(cmd), "vkEndCommandBuffer");
            check(vkQueueSubmit(queue, 1, &si, fence), "vkQueueSubmit");
            check(vkWaitForFences(g_dev, 1, &fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");
            check(vkResetFences(g_dev, 1, &fence), "vkResetFences");
            check(vkGetQueryPoolResults(g_dev, qpool, 0, 2, sizeof ts, ts, sizeof ts[0],
                                        VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
                  "vkGetQueryPoolResults");
            us[rep] = (double)(ts[1] - ts[0]) * pp.limits.timestampPeriod / 1000.0;
        }
        qsort(us, REPS, sizeof us[0], by_value);
        flop = 2.0 * 2.0 * br * bc * 128.0 * ITERS * groups; /* S and P V */
        printf("%s (BR %u, BC %u): median %.1f us (fastest %.1f), %.1f TFLOP/s;%s\n", path, br, bc, us[REPS / 2], us[0],
               flop / us[REPS / 2] / 1e6, stats);
        vkDestroyPipeline(g_dev, pipe, NULL);
        vkDestroyShaderModule(g_dev, sm, NULL);
        free(code);
    }
    vkDeviceWaitIdle(g_dev);
    vkDestroyFence(g_dev, fence, NULL);
    vkDestroyQueryPool(g_dev, qpool, NULL);
    vkDestroyCommandPool(g_dev, cpool, NULL);
    vkDestroyDescriptorPool(g_dev, dpool, NULL);
    vkDestroyPipelineLayout(g_dev, layout, NULL);
    vkDestroyDescriptorSetLayout(g_dev, dsl, NULL);
    vkDestroyBuffer(g_dev, bk, NULL);
    vkDestroyBuffer(g_dev, bv, NULL);
    vkDestroyBuffer(g_dev, bo, NULL);
    vkDestroyBuffer(g_dev, bh, NULL);
    vkFreeMemory(g_dev, mk, NULL);
    vkFreeMemory(g_dev, mv, NULL);
    vkFreeMemory(g_dev, mo, NULL);
    vkFreeMemory(g_dev, mh, NULL);
    vkDestroyDevice(g_dev, NULL);
    vkDestroyInstance(inst, NULL);
    return 0;
}
