// Stand-alone driver of RunEvaluatorBench (kernels/bench.h) until `lipcert bench` is wired:
//   kernels_bench --n N --d D --heads H --batch B [--kind dot|l2] [--device cpu|cuda]
//                 [--dtype f32|f64] [--threads T] [--rel-tol TOL] [--method lanczos|power]
//                 [--max-iters K] [--min-seconds S]
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>

#include "kernels/bench.h"

int main(int argc, char** argv) {
  lipcert::BenchOptions o;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (i + 1 >= argc) throw std::invalid_argument(a + ": missing value");
      const std::string v = argv[++i];
      if (a == "--n") o.n = std::stoi(v);
      else if (a == "--d") o.d = std::stoi(v);
      else if (a == "--heads") o.heads = std::stoi(v);
      else if (a == "--batch") o.batch = std::stoi(v);
      else if (a == "--threads") o.threads = std::stoi(v);
      else if (a == "--rel-tol") o.rel_tol = std::stod(v);
      else if (a == "--max-iters") o.max_iters = std::stoi(v);
      else if (a == "--min-seconds") o.min_seconds = std::stod(v);
      else if (a == "--kind") {
        if (!lipcert::StringToAttentionKind(v, &o.kind)) throw std::invalid_argument("--kind: dot or l2");
      } else if (a == "--device") {
        if (!lipcert::StringToDevice(v, &o.device)) throw std::invalid_argument("--device: cpu or cuda");
      } else if (a == "--dtype") {
        if (!lipcert::StringToDType(v, &o.dtype)) throw std::invalid_argument("--dtype: f32 or f64");
      } else if (a == "--method") {
        if (!lipcert::StringToSingularMethod(v, &o.method)) throw std::invalid_argument("--method: lanczos or power");
      } else {
        throw std::invalid_argument("unknown option " + a);
      }
    }
    std::cout << lipcert::RunEvaluatorBench(o) << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "kernels_bench: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
