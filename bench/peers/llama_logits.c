// llama_logits: llama.cpp's logits for one prompt of token ids, in the layout `hostd eval`
// writes, for bench/peers/gguf-parity.sh. The prompt is decoded in one batch with logits at
// every position; then N greedy steps (argmax, lowest id on ties): step 0's logits are the
// prompt's last row, step i's come from feeding step i−1's id. Output: a little-endian f32 file
// of (P + N) rows of n_vocab logits, and the greedy ids on stdout.
//
// Usage: llama_logits MODEL.gguf IDS_FILE OUT.f32 N_GREEDY THREADS
// (IDS_FILE: whitespace-separated token ids.) Built by gguf-parity.sh against bench/peers'
// llama.cpp build.
#include <stdio.h>
#include <stdlib.h>
#include "llama.h"

static int argmax(const float *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) {
        if (v[i] > v[best]) best = i;
    }
    return best;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s MODEL.gguf IDS_FILE OUT.f32 N_GREEDY THREADS\n", argv[0]);
        return 2;
    }
    int n_greedy = atoi(argv[4]);
    int threads = atoi(argv[5]);
    FILE *f = fopen(argv[2], "r");
    if (!f) { perror(argv[2]); return 1; }
    llama_token ids[4096];
    int n = 0;
    int id;
    while (fscanf(f, "%d", &id) == 1) {
        if (n == 4096) { fprintf(stderr, "%s: more than 4096 ids\n", argv[2]); return 1; }
        ids[n++] = id;
    }
    fclose(f);
    if (n == 0) { fprintf(stderr, "no ids in %s\n", argv[2]); return 1; }

    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n + n_greedy + 16;
    cp.n_batch = n;
    cp.n_ubatch = n;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "cannot make a context\n"); return 1; }
    int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    FILE *out = fopen(argv[3], "wb");
    if (!out) { perror(argv[3]); return 1; }
    struct llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        batch.token[i] = ids[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n;
    if (llama_decode(ctx, batch)) { fprintf(stderr, "prompt decode failed\n"); return 1; }
    for (int i = 0; i < n; i++) {
        fwrite(llama_get_logits_ith(ctx, i), sizeof(float), n_vocab, out);
    }
    float *last = llama_get_logits_ith(ctx, n - 1);
    for (int step = 0; step < n_greedy; step++) {
        if (step > 0) {
            llama_token prev = argmax(last, n_vocab);
            struct llama_batch one = llama_batch_get_one(&prev, 1);
            if (llama_decode(ctx, one)) { fprintf(stderr, "step %d failed\n", step); return 1; }
            last = llama_get_logits_ith(ctx, -1);
        }
        fwrite(last, sizeof(float), n_vocab, out);
        printf("%d%s", argmax(last, n_vocab), step + 1 < n_greedy ? " " : "\n");
    }
    fclose(out);
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
