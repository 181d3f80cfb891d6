// peer-ggml's bridge to ggml's CPU backend: quantized weight copies (plain or in the CPU_REPACK
// buffer type that llama.cpp uses for weights), one `ggml_mul_mat` graph per copy, computed on a
// persistent ggml thread pool that the harness pauses while moshi-kernels runs.

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

typedef struct peer_runtime {
    ggml_backend_t backend;
    struct ggml_threadpool *pool;
} peer_runtime;

typedef struct peer_matrix {
    peer_runtime *runtime;
    enum ggml_type type;
    int64_t rows, cols;
    int copies;
    struct ggml_context *weight_ctx;
    ggml_backend_buffer_t weight_buffer;
    struct ggml_tensor **weights;
    // Rebuilt by peer_matrix_bind for each activation row count.
    struct ggml_context *graph_ctx;
    ggml_backend_buffer_t graph_buffer;
    struct ggml_cgraph **graphs;
    struct ggml_tensor **outputs;
    int m;
} peer_matrix;

// Writes a message into `error` (capacity `error_len`) and returns -1.
static int fail(char *error, size_t error_len, const char *message, const char *detail) {
    snprintf(error, error_len, "%s%s", message, detail ? detail : "");
    return -1;
}

int peer_type_from_name(const char *name) {
    if (strcmp(name, "q4_0") == 0) return GGML_TYPE_Q4_0;
    if (strcmp(name, "q4_K") == 0) return GGML_TYPE_Q4_K;
    if (strcmp(name, "q8_0") == 0) return GGML_TYPE_Q8_0;
    return -1;
}

size_t peer_row_bytes(int type, int64_t cols) {
    return ggml_row_size((enum ggml_type)type, cols);
}

int64_t peer_block_size(int type) {
    return ggml_blck_size((enum ggml_type)type);
}

// Quantizes row-major f32 [rows, cols] into `dst` (rows * peer_row_bytes bytes); returns bytes.
size_t peer_quantize(int type, const float *src, int64_t rows, int64_t cols, void *dst) {
    return ggml_quantize_chunk((enum ggml_type)type, src, dst, 0, rows, cols, NULL);
}

void peer_dequantize(int type, const void *src, int64_t rows, int64_t cols, float *dst) {
    const struct ggml_type_traits *traits = ggml_get_type_traits((enum ggml_type)type);
    size_t row_bytes = ggml_row_size((enum ggml_type)type, cols);
    for (int64_t r = 0; r < rows; r++) {
        traits->to_float((const char *)src + r * row_bytes, dst + r * cols, cols);
    }
}

// The last "repack: repack tensor ... with <layout>" line of ggml's log (debug level): the
// layout CPU_REPACK chose, the evidence that the repacked kernels are the ones set up.
static char last_repack[128];

static void log_callback(enum ggml_log_level level, const char *text, void *user_data) {
    (void)user_data;
    const char *with = strstr(text, "repack tensor");
    if (with && (with = strstr(with, " with "))) {
        snprintf(last_repack, sizeof last_repack, "%s", with + 6);
        last_repack[strcspn(last_repack, "\n")] = 0;
    } else if (level >= GGML_LOG_LEVEL_WARN) {
        fputs(text, stderr);
    }
}

peer_runtime *peer_runtime_new(int threads) {
    peer_runtime *runtime = calloc(1, sizeof *runtime);
    if (!runtime) return NULL;
    ggml_log_set(log_callback, NULL);
    runtime->backend = ggml_backend_cpu_init();
    struct ggml_threadpool_params params = ggml_threadpool_params_default(threads);
    runtime->pool = ggml_threadpool_new(&params);
    if (!runtime->backend || !runtime->pool) {
        if (runtime->backend) ggml_backend_free(runtime->backend);
        if (runtime->pool) ggml_threadpool_free(runtime->pool);
        free(runtime);
        return NULL;
    }
    ggml_backend_cpu_set_n_threads(runtime->backend, threads);
    ggml_backend_cpu_set_threadpool(runtime->backend, runtime->pool);
    return runtime;
}

// Parks ggml's workers (they would otherwise poll for the next graph while moshi-kernels runs);
// the next compute resumes them.
void peer_runtime_pause(peer_runtime *runtime) { ggml_threadpool_pause(runtime->pool); }

void peer_runtime_free(peer_runtime *runtime) {
    ggml_backend_free(runtime->backend);
    ggml_threadpool_free(runtime->pool);
    free(runtime);
}

// The CPU backend's extra buffer type named `name` ("CPU_REPACK"), found as llama.cpp finds it.
static ggml_backend_buffer_type_t extra_buffer_type(const char *name) {
    ggml_backend_dev_t device = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(device);
    ggml_backend_dev_get_extra_bufts_t get_extra = (ggml_backend_dev_get_extra_bufts_t)
        ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    if (!get_extra) return NULL;
    for (ggml_backend_buffer_type_t *buft = get_extra(device); buft && *buft; buft++) {
        if (strcmp(ggml_backend_buft_name(*buft), name) == 0) return *buft;
    }
    return NULL;
}

static void graphs_free(peer_matrix *matrix) {
    if (matrix->graph_buffer) ggml_backend_buffer_free(matrix->graph_buffer);
    if (matrix->graph_ctx) ggml_free(matrix->graph_ctx);
    matrix->graph_buffer = NULL;
    matrix->graph_ctx = NULL;
}

void peer_matrix_free(peer_matrix *matrix) {
    if (!matrix) return;
    graphs_free(matrix);
    if (matrix->weight_buffer) ggml_backend_buffer_free(matrix->weight_buffer);
    if (matrix->weight_ctx) ggml_free(matrix->weight_ctx);
    free(matrix->weights);
    free(matrix->graphs);
    free(matrix->outputs);
    free(matrix);
}

// `copies` tensors of `type` [rows, cols] holding the quantized `blocks`, in the CPU buffer type
// or (`repack`) in CPU_REPACK, whose set_tensor interleaves the blocks for its gemv/gemm kernels.
// Writes the buffer type's name into `buffer_name`, with the layout CPU_REPACK chose.
peer_matrix *peer_matrix_new(peer_runtime *runtime, int type, int repack, int64_t rows,
                             int64_t cols, const void *blocks, int copies, char *buffer_name,
                             size_t name_len, char *error, size_t error_len) {
    peer_matrix *matrix = calloc(1, sizeof *matrix);
    if (!matrix) {
        fail(error, error_len, "out of memory", NULL);
        return NULL;
    }
    matrix->runtime = runtime;
    matrix->type = (enum ggml_type)type;
    matrix->rows = rows;
    matrix->cols = cols;
    matrix->copies = copies;
    matrix->weights = calloc(copies, sizeof *matrix->weights);
    matrix->graphs = calloc(copies, sizeof *matrix->graphs);
    matrix->outputs = calloc(copies, sizeof *matrix->outputs);
    ggml_backend_buffer_type_t buft = repack ? extra_buffer_type("CPU_REPACK")
                                             : ggml_backend_get_default_buffer_type(runtime->backend);
    struct ggml_init_params params = {copies * ggml_tensor_overhead(), NULL, true};
    matrix->weight_ctx = ggml_init(params);
    if (!buft || !matrix->weights || !matrix->graphs || !matrix->outputs || !matrix->weight_ctx) {
        fail(error, error_len, buft ? "out of memory" : "no CPU_REPACK buffer type in this ggml build", NULL);
        peer_matrix_free(matrix);
        return NULL;
    }
    for (int c = 0; c < copies; c++) {
        matrix->weights[c] = ggml_new_tensor_2d(matrix->weight_ctx, matrix->type, cols, rows);
    }
    matrix->weight_buffer = ggml_backend_alloc_ctx_tensors_from_buft(matrix->weight_ctx, buft);
    if (!matrix->weight_buffer) {
        fail(error, error_len, "could not allocate the weights in ", ggml_backend_buft_name(buft));
        peer_matrix_free(matrix);
        return NULL;
    }
    if (repack && !matrix->weights[0]->extra) {
        // CPU_REPACK's init_tensor found no interleaved layout for this type and row count.
        fail(error, error_len, "CPU_REPACK has no repacked layout for this type at this row count", NULL);
        peer_matrix_free(matrix);
        return NULL;
    }
    size_t bytes = ggml_row_size(matrix->type, cols) * rows;
    last_repack[0] = 0;
    for (int c = 0; c < copies; c++) {
        ggml_backend_tensor_set(matrix->weights[c], blocks, 0, bytes);
    }
    const char *name = ggml_backend_buffer_name(matrix->weights[0]->buffer);
    if (last_repack[0]) {
        snprintf(buffer_name, name_len, "%s (repacked to %s)", name, last_repack);
    } else {
        snprintf(buffer_name, name_len, "%s", name);
    }
    return matrix;
}

// Builds one `y[m, rows] = x[m, cols] · Wᵀ` graph per copy, the activations `x` copied in once.
int peer_matrix_bind(peer_matrix *matrix, const float *x, int m, char *error, size_t error_len) {
    graphs_free(matrix);
    int copies = matrix->copies;
    size_t overhead = (2 + 2 * (size_t)copies) * ggml_tensor_overhead() +
                      copies * ggml_graph_overhead_custom(8, false);
    struct ggml_init_params params = {overhead, NULL, true};
    matrix->graph_ctx = ggml_init(params);
    if (!matrix->graph_ctx) return fail(error, error_len, "out of memory", NULL);
    struct ggml_tensor *input = ggml_new_tensor_2d(matrix->graph_ctx, GGML_TYPE_F32, matrix->cols, m);
    for (int c = 0; c < copies; c++) {
        matrix->outputs[c] = ggml_mul_mat(matrix->graph_ctx, matrix->weights[c], input);
        matrix->graphs[c] = ggml_new_graph_custom(matrix->graph_ctx, 8, false);
        ggml_build_forward_expand(matrix->graphs[c], matrix->outputs[c]);
    }
    matrix->graph_buffer = ggml_backend_alloc_ctx_tensors(matrix->graph_ctx, matrix->runtime->backend);
    if (!matrix->graph_buffer) return fail(error, error_len, "could not allocate the activations", NULL);
    ggml_backend_tensor_set(input, x, 0, sizeof(float) * matrix->cols * m);
    matrix->m = m;
    return 0;
}

int peer_matrix_compute(peer_matrix *matrix, int copy) {
    return ggml_backend_graph_compute(matrix->runtime->backend, matrix->graphs[copy]) == GGML_STATUS_SUCCESS ? 0 : -1;
}

// Copies the last product of `copy` into `y` (m * rows floats).
void peer_matrix_output(peer_matrix *matrix, int copy, float *y) {
    ggml_backend_tensor_get(matrix->outputs[copy], y, 0, sizeof(float) * matrix->rows * matrix->m);
}
