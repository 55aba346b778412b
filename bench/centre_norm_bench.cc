// The certified centre norm ||J(X0)||_2 of one checkpoint layer at one centre, with its
// method, time and the floating estimate (docs/engines.md, "Centre norm").
//
//   build/bench/centre_norm_bench MODEL LAYER CENTRE [--preset P] [--pre-ln] [--dense-limit N]
//                                 [--block-tokens G] [--block-limit M] [--threads T] [--deflate K] [--no-gemm]
//                                 [--no-factored] [--factored-only]
//                                 [--seconds S]
//
// MODEL and CENTRE as for `lipcert certify` (--model, --center); LayerNorm is dropped unless
// --pre-ln, which certifies the sublayer X + MHA(LN(X)) (BERT layers load as attention
// alone: they get a unit LayerNorm, gamma 1 and beta 0). --no-gemm takes the general
// per-head assembly in place of the fused one; --seconds S gives the engine a deadline S
// seconds from the start (the route then sizes its work to it). Prints one line:
//   bound=<certified> estimate=<floating sigma_1> method=<dense|super_block> groups=<G> seconds=<s>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "certify/centre_norm.h"
#include "models/centre.h"
#include "models/loader.h"

int main(int argc, char** argv) {
  using namespace lipcert;
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s MODEL LAYER CENTRE [--preset P] [--pre-ln] [--dense-limit N] "
                         "[--block-tokens G] [--block-limit M] [--threads T] [--deflate K] [--no-gemm] [--no-factored] [--factored-only] [--seconds S]\n", argv[0]);
    return 2;
  }
  try {
    LoadOptions lo;
    lo.preset = "bert";
    lo.layer = std::atoi(argv[2]);
    CentreNormOptions o;
    bool pre_ln = false;
    for (int i = 4; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(a + ": missing value");
        return argv[++i];
      };
      if (a == "--preset") lo.preset = next();
      else if (a == "--pre-ln") pre_ln = true;
      else if (a == "--dense-limit") o.dense_limit = std::atol(next().c_str());
      else if (a == "--block-tokens") o.block_tokens = std::atoi(next().c_str());
      else if (a == "--block-limit") o.block_limit = std::atol(next().c_str());
      else if (a == "--threads") o.threads = std::atoi(next().c_str());
      else if (a == "--no-gemm") o.gemm_assembly = false;
      else if (a == "--no-factored") o.factored_heads = false;
      else if (a == "--factored-only") o.super_blocks = false;
      else if (a == "--deflate") o.deflation_vectors = std::atoi(next().c_str());
      else if (a == "--seconds")  // a deadline, as lipcert certify gives the engine
        o.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(long(1000 * std::atof(next().c_str())));
      else throw std::invalid_argument("unknown option " + a);
    }
    LoadedModel m = LoadModel(argv[1], lo);
    AttentionLayer L = m.layers.at(0);
    if (!pre_ln) {
      L.layer_norm.reset();
    } else if (!L.layer_norm) {  // BERT's attention has none before it: a unit LayerNorm
      LayerNormParams ln;
      ln.gamma = Eigen::VectorXd::Ones(L.d_model);
      ln.beta = Eigen::VectorXd::Zero(L.d_model);
      ln.eps = 1e-12;
      L.layer_norm = ln;
    }
    const Eigen::MatrixXd x0 = LoadCentre(argv[3], 0, L.d_model);
    CentreNormReport rep;
    const UpperBound b = CentreJacobianNormUpperBound(L, x0, o, &rep);
    std::printf("N=%d D=%d H=%d bound=%.10g estimate=%.10g method=%s groups=%d group_tokens=%d frobenius=%d "
                "seconds=%.2f model_seconds=%.2f assembly=%.2f gram=%.2f lanczos=%.2f cholesky=%.2f attempts=%d\n",
                int(x0.rows()), L.d_model, L.heads, b.value(), rep.estimate, rep.method.c_str(), rep.groups,
                rep.group_tokens, int(rep.frobenius_blocks), rep.seconds,
                CentreNormSecondsEstimate(L, int(x0.rows()), o), rep.assembly_seconds, rep.gram.gram_seconds,
                rep.gram.lanczos_seconds, rep.gram.cholesky_seconds, rep.gram.cholesky_attempts);
    if (std::isfinite(rep.factored))
      std::printf("factored heads: %.6g = min(values %.6g + min(keys %.6g + queries %.6g, both with their cross term %.6g), "
                  "all with the cross terms %.6g) in %.2f s (model %.2f s)%s\n", rep.factored, rep.factored_value,
                  rep.factored_keys, rep.factored_queries, rep.factored_keys_and_queries, rep.factored_crossed,
                  rep.factored_seconds,
                  FactoredHeadsSecondsEstimate(L, int(x0.rows())), rep.factored_won ? ", the bound returned" : "");
    if (rep.deflation_vectors > 0)
      std::printf("deflation: k=%d basis=%.2f s ||Y+D||<=%.6g ||E||<=%.6g coupling<=%.6g exact_blocks=%d\n",
                  rep.deflation_vectors, rep.deflation_basis_seconds, rep.deflated_top, rep.deflated_rest,
                  rep.deflation_coupling, rep.exact_blocks);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "centre_norm_bench: %s\n", e.what());
    return 2;
  }
}
