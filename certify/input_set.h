// The compact input set a certificate is about, and the norm it is measured in.
//   ball:   ||X - X0||_F <= r
//   tokens: ||x_i - x0_i||_2 <= r for every token i   (X0 = 0: Castin et al.'s B_R^N)
//   box:    |X - X0|_max <= r
#pragma once

#include <Eigen/Dense>
#include <string>

namespace lipcert {

enum class SetKind { kBall, kTokens, kBox };
enum class NormKind { kL2, kLinf };  // on inputs and outputs alike (Frobenius / max-abs)

const char* SetKindToString(SetKind k);    // "ball" | "tokens" | "box"
bool StringToSetKind(const std::string& s, SetKind* k);
const char* NormKindToString(NormKind k);  // "2" | "inf"
bool StringToNormKind(const std::string& s, NormKind* k);

struct InputSet {
  SetKind kind = SetKind::kBall;
  Eigen::MatrixXd center;  // X0, (N, D)
  double radius = 0;       // r >= 0

  int tokens() const { return int(center.rows()); }
  int width() const { return int(center.cols()); }

  // True when x lies in the set, allowing a relative slack for rounding in the caller.
  bool Contains(const Eigen::MatrixXd& x, double rel_slack = 0) const;
  // The nearest point of the set (Euclidean projection; exact for all three kinds).
  Eigen::MatrixXd Project(const Eigen::MatrixXd& x) const;
  // Upper bound on ||x_i - x0_i||_2 over the set, the same for every token.
  double TokenRadius() const;
  // Upper bound on ||X - X0||_F over the set.
  double FrobeniusRadius() const;
};

}  // namespace lipcert
