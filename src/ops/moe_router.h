// The Qwen3-MoE router around the expert kernel: softmax over all experts in fp32, top-k,
// optional renormalisation, and the routing statistics the load-balancing loss and the
// aux-loss-free expert bias need. The router's linear layer is an ordinary matmul op.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// Up to this many experts, each thread sorts a token's scores on its stack (8 bytes each).
#define MOE_ROUTE_STACK 1024

// The scratch moe_route_forward needs, in floats: none up to MOE_ROUTE_STACK experts; for a
// wider router, E (score, index) pairs per thread for `threads` threads. The model plans it with
// its activations, so the step allocates nothing.
size_t moe_route_scratch_floats(int E, int threads);

// probs(N,E): in, the router logits; out, their softmax (fp32, max-subtracted, as torch's).
// expert(N,K), weight(N,K): for each token the K experts with the largest probs + bias (bias
// (E) may be NULL: the aux-loss-free expert bias affects the choice only), in descending order
// of that score. Ties are broken exactly as torch.topk on CPU breaks them (PyTorch's TopKImpl:
// libstdc++'s partial_sort when 64*K <= E, else nth_element then sort, over (score, index)
// pairs compared by score only), because equal probabilities do happen (a zero router gives
// all-equal rows) and HF picks its experts that way; weight is the
// chosen experts' probability (without bias), divided by the sum of the K of them when `norm`
// (norm_topk_prob), the sum taken in that same descending order.
// scratch: moe_route_scratch_floats(E, threads) floats (NULL when that is 0); a router wider
// than MOE_ROUTE_STACK then runs on at most `threads` threads. The result does not depend on
// the thread count.
void moe_route_forward(int32_t *expert, float *weight, float *probs, const float *bias, int N,
                       int E, int K, bool norm, float *scratch, int threads);

// dlogits(N,E) (overwritten; may alias nothing) = the gradient through the softmax of
//   dprobs[n,e] = (the gradient reaching probs[n,e] through weight[n,k] for e = expert[n,k],
//                  including the renormalisation when `norm`)
//               + aux_dprob[e] (the load-balancing loss's gradient; aux_dprob may be NULL).
void moe_route_backward(float *dlogits, const float *dweight, const float *aux_dprob,
                        const float *probs, const int32_t *expert, const float *weight, int N,
                        int E, int K, bool norm);

// load[e] += number of tokens whose top K include e; prob_sum[e] += sum over tokens of
// probs[n,e]. Summed in token order (deterministic).
void moe_route_stats(double *load, double *prob_sum, const int32_t *expert, const float *probs,
                     int N, int E, int K);
