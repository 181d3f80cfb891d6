// peer-ggml's bridge to ggml's CPU backend: quantized weight copies (plain or in the CPU_REPACK
// buffer type that llama.cpp uses for weights), one `ggml_mul_mat` graph per copy, computed on a
// persistent ggml thread pool that the harness pauses while moshi-kernels runs.

#include <math.h>
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

// ---- A whole decode step: the temporal transformer of Moshi 7B as llama.cpp builds a decode
// graph (one token; the same products, norms, rotary embedding, attention over an f16 KV cache
// and gated feed-forward), then the text head. One graph, computed once per step.

typedef struct peer_step {
    peer_runtime *runtime;
    struct ggml_context *weight_ctx;
    ggml_backend_buffer_t weight_buffer;
    struct ggml_context *state_ctx;
    ggml_backend_buffer_t state_buffer;
    struct ggml_context *graph_ctx;
    ggml_backend_buffer_t graph_buffer;
    struct ggml_cgraph *graph;
    struct ggml_tensor *input, *position, *logits;
    int64_t dim, vocab;
} peer_step;

void peer_step_free(peer_step *step) {
    if (!step) return;
    if (step->graph_buffer) ggml_backend_buffer_free(step->graph_buffer);
    if (step->graph_ctx) ggml_free(step->graph_ctx);
    if (step->state_buffer) ggml_backend_buffer_free(step->state_buffer);
    if (step->state_ctx) ggml_free(step->state_ctx);
    if (step->weight_buffer) ggml_backend_buffer_free(step->weight_buffer);
    if (step->weight_ctx) ggml_free(step->weight_ctx);
    free(step);
}

// The shapes of one step and the quantized blocks every layer's matrices are copied from.
typedef struct peer_step_shape {
    int64_t layers, dim, heads, hidden, vocab, kv_positions;
    // [3 * dim, dim], [dim, dim], [2 * hidden, dim], [dim, hidden], [vocab, dim]
    const void *in_proj, *out_proj, *gating_in, *gating_out, *text_head;
} peer_step_shape;

// One layer's tensors.
typedef struct step_layer {
    struct ggml_tensor *norm1, *norm2, *in_proj, *out_proj, *gating_in, *gating_out, *keys, *values;
} step_layer;

// The attention of one layer at the cache's last position: rotary embedding of the new query and
// key, both written into the cache, scores over every cached position, softmax, values.
static struct ggml_tensor *step_attention(struct ggml_context *ctx, struct ggml_cgraph *graph,
                                          const peer_step_shape *s, const step_layer *l,
                                          struct ggml_tensor *qkv, struct ggml_tensor *position) {
    int64_t head_dim = s->dim / s->heads, kv = s->kv_positions;
    size_t f = sizeof(float), h = ggml_element_size(l->keys);
    struct ggml_tensor *q = ggml_view_3d(ctx, qkv, head_dim, s->heads, 1, head_dim * f, 3 * s->dim * f, 0);
    struct ggml_tensor *k = ggml_view_3d(ctx, qkv, head_dim, s->heads, 1, head_dim * f, 3 * s->dim * f, s->dim * f);
    struct ggml_tensor *v = ggml_view_2d(ctx, qkv, s->dim, 1, 3 * s->dim * f, 2 * s->dim * f);
    q = ggml_rope_ext(ctx, q, position, NULL, head_dim, GGML_ROPE_TYPE_NEOX, 0, 10000.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
    k = ggml_rope_ext(ctx, k, position, NULL, head_dim, GGML_ROPE_TYPE_NEOX, 0, 10000.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
    // Keys [head_dim, heads, kv] by position; values transposed, [kv, dim], as llama.cpp keeps
    // them without flash attention.
    struct ggml_tensor *k_slot = ggml_view_3d(ctx, l->keys, head_dim, s->heads, 1, head_dim * h,
                                              s->dim * h, (kv - 1) * s->dim * h);
    struct ggml_tensor *v_slot = ggml_view_2d(ctx, l->values, 1, s->dim, kv * h, (kv - 1) * h);
    ggml_build_forward_expand(graph, ggml_cpy(ctx, k, k_slot));
    ggml_build_forward_expand(graph, ggml_cpy(ctx, ggml_transpose(ctx, v), v_slot));
    struct ggml_tensor *keys = ggml_permute(ctx, ggml_view_3d(ctx, l->keys, head_dim, s->heads, kv,
                                                              head_dim * h, s->dim * h, 0), 0, 2, 1, 3);
    struct ggml_tensor *scores = ggml_mul_mat(ctx, keys, ggml_permute(ctx, q, 0, 2, 1, 3));
    scores = ggml_soft_max_ext(ctx, scores, NULL, 1.0f / sqrtf((float)head_dim), 0.0f);
    struct ggml_tensor *values = ggml_view_3d(ctx, l->values, kv, head_dim, s->heads, kv * h,
                                              kv * h * head_dim, 0);
    struct ggml_tensor *out = ggml_mul_mat(ctx, values, scores);
    return ggml_cont_2d(ctx, ggml_permute(ctx, out, 0, 2, 1, 3), s->dim, 1);
}

static struct ggml_tensor *step_layer_graph(struct ggml_context *ctx, struct ggml_cgraph *graph,
                                            const peer_step_shape *s, const step_layer *l,
                                            struct ggml_tensor *x, struct ggml_tensor *position) {
    struct ggml_tensor *h = ggml_mul(ctx, ggml_rms_norm(ctx, x, 1e-8f), l->norm1);
    struct ggml_tensor *qkv = ggml_mul_mat(ctx, l->in_proj, h);
    x = ggml_add(ctx, x, ggml_mul_mat(ctx, l->out_proj, step_attention(ctx, graph, s, l, qkv, position)));
    h = ggml_mul(ctx, ggml_rms_norm(ctx, x, 1e-8f), l->norm2);
    struct ggml_tensor *gate_value = ggml_mul_mat(ctx, l->gating_in, h);
    size_t f = sizeof(float);
    struct ggml_tensor *gate = ggml_view_2d(ctx, gate_value, s->hidden, 1, 2 * s->hidden * f, 0);
    struct ggml_tensor *value = ggml_view_2d(ctx, gate_value, s->hidden, 1, 2 * s->hidden * f, s->hidden * f);
    return ggml_add(ctx, x, ggml_mul_mat(ctx, l->gating_out, ggml_swiglu_split(ctx, gate, value)));
}

// Sets every element of an f32 tensor to `value`.
static void fill_f32(struct ggml_tensor *t, float value) {
    int64_t n = ggml_nelements(t);
    float *v = malloc(n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = value;
    ggml_backend_tensor_set(t, v, 0, n * sizeof *v);
    free(v);
}

// Makes the weights (quantized, in CPU_REPACK with `repack`), the KV caches (f16, zero) and the
// graph of one step at position `kv_positions - 1`.
peer_step *peer_step_new(peer_runtime *runtime, int type, int repack, const peer_step_shape *s,
                         char *error, size_t error_len) {
    peer_step *step = calloc(1, sizeof *step);
    step_layer *layers = calloc(s->layers, sizeof *layers);
    if (!step || !layers) {
        free(step);
        free(layers);
        fail(error, error_len, "out of memory", NULL);
        return NULL;
    }
    step->runtime = runtime;
    step->dim = s->dim;
    step->vocab = s->vocab;
    enum ggml_type t = (enum ggml_type)type;
    ggml_backend_buffer_type_t buft = repack ? extra_buffer_type("CPU_REPACK")
                                             : ggml_backend_get_default_buffer_type(runtime->backend);
    struct ggml_init_params wp = {(5 * s->layers + 1) * ggml_tensor_overhead(), NULL, true};
    struct ggml_init_params sp = {(4 * s->layers + 3) * ggml_tensor_overhead(), NULL, true};
    step->weight_ctx = ggml_init(wp);
    step->state_ctx = ggml_init(sp);
    if (!buft || !step->weight_ctx || !step->state_ctx) goto out_of_memory;
    struct ggml_tensor *head = ggml_new_tensor_2d(step->weight_ctx, t, s->dim, s->vocab);
    for (int64_t i = 0; i < s->layers; i++) {
        step_layer *l = &layers[i];
        l->in_proj = ggml_new_tensor_2d(step->weight_ctx, t, s->dim, 3 * s->dim);
        l->out_proj = ggml_new_tensor_2d(step->weight_ctx, t, s->dim, s->dim);
        l->gating_in = ggml_new_tensor_2d(step->weight_ctx, t, s->dim, 2 * s->hidden);
        l->gating_out = ggml_new_tensor_2d(step->weight_ctx, t, s->hidden, s->dim);
        l->norm1 = ggml_new_tensor_1d(step->state_ctx, GGML_TYPE_F32, s->dim);
        l->norm2 = ggml_new_tensor_1d(step->state_ctx, GGML_TYPE_F32, s->dim);
        l->keys = ggml_new_tensor_3d(step->state_ctx, GGML_TYPE_F16, s->dim / s->heads, s->heads, s->kv_positions);
        l->values = ggml_new_tensor_2d(step->state_ctx, GGML_TYPE_F16, s->kv_positions, s->dim);
    }
    struct ggml_tensor *out_norm = ggml_new_tensor_1d(step->state_ctx, GGML_TYPE_F32, s->dim);
    step->input = ggml_new_tensor_2d(step->state_ctx, GGML_TYPE_F32, s->dim, 1);
    step->position = ggml_new_tensor_1d(step->state_ctx, GGML_TYPE_I32, 1);
    step->weight_buffer = ggml_backend_alloc_ctx_tensors_from_buft(step->weight_ctx, buft);
    step->state_buffer = ggml_backend_alloc_ctx_tensors(step->state_ctx, runtime->backend);
    if (!step->weight_buffer || !step->state_buffer) goto out_of_memory;
    ggml_backend_buffer_clear(step->state_buffer, 0);
    for (int64_t i = 0; i < s->layers; i++) {
        step_layer *l = &layers[i];
        ggml_backend_tensor_set(l->in_proj, s->in_proj, 0, ggml_nbytes(l->in_proj));
        ggml_backend_tensor_set(l->out_proj, s->out_proj, 0, ggml_nbytes(l->out_proj));
        ggml_backend_tensor_set(l->gating_in, s->gating_in, 0, ggml_nbytes(l->gating_in));
        ggml_backend_tensor_set(l->gating_out, s->gating_out, 0, ggml_nbytes(l->gating_out));
        fill_f32(l->norm1, 1.0f);
        fill_f32(l->norm2, 1.0f);
    }
    ggml_backend_tensor_set(head, s->text_head, 0, ggml_nbytes(head));
    fill_f32(out_norm, 1.0f);
    int32_t position = (int32_t)(s->kv_positions - 1);
    ggml_backend_tensor_set(step->position, &position, 0, sizeof position);

    size_t nodes = 64 * (size_t)s->layers + 64;
    struct ggml_init_params gp = {nodes * ggml_tensor_overhead() + ggml_graph_overhead_custom(nodes, false), NULL, true};
    step->graph_ctx = ggml_init(gp);
    if (!step->graph_ctx) goto out_of_memory;
    step->graph = ggml_new_graph_custom(step->graph_ctx, nodes, false);
    struct ggml_tensor *x = step->input;
    for (int64_t i = 0; i < s->layers; i++) {
        x = step_layer_graph(step->graph_ctx, step->graph, s, &layers[i], x, step->position);
    }
    x = ggml_mul(step->graph_ctx, ggml_rms_norm(step->graph_ctx, x, 1e-8f), out_norm);
    step->logits = ggml_mul_mat(step->graph_ctx, head, x);
    ggml_build_forward_expand(step->graph, step->logits);
    step->graph_buffer = ggml_backend_alloc_ctx_tensors(step->graph_ctx, runtime->backend);
    free(layers);
    if (!step->graph_buffer) {
        peer_step_free(step);
        fail(error, error_len, "could not allocate the step's graph", NULL);
        return NULL;
    }
    return step;
out_of_memory:
    free(layers);
    peer_step_free(step);
    fail(error, error_len, "out of memory (or no CPU_REPACK buffer type)", NULL);
    return NULL;
}

// One step on the input `x` (dim floats); its text logits into `logits` (vocab floats) if not NULL.
int peer_step_compute(peer_step *step, const float *x, float *logits) {
    ggml_backend_tensor_set(step->input, x, 0, step->dim * sizeof *x);
    if (ggml_backend_graph_compute(step->runtime->backend, step->graph) != GGML_STATUS_SUCCESS) return -1;
    if (logits) ggml_backend_tensor_get(step->logits, logits, 0, step->vocab * sizeof *logits);
    return 0;
}
