// Calling a program of the AOTInductor package (model.pt2) with its inputs checked first,
// as ufsemulator.export.aoti.load does in Python: float32, on the CPU, 2-D, the program's
// number of columns, as many rows as `inputs`; a strided tensor is copied (cheap next to
// the call), anything else is refused with a message naming the input. The package checks
// the same itself (torch's input checks, compiled in and on), in torch's words.
#pragma once

#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/torch.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace checked {

struct Argument {
  std::string name;
  int64_t columns;
};

// The inputs of each program, in order (ufsemulator.export.aoti.arguments).
inline std::vector<Argument> arguments(const std::string& model, int64_t n_in, int64_t n_out) {
  if (model == "predict") return {{"inputs", n_in}};
  if (model == "jac_physical") return {{"inputs", n_in}, {"mask", 1}};
  if (model == "tlm") return {{"inputs", n_in}, {"dx", n_in}, {"mask", 1}};
  if (model == "adjoint") return {{"inputs", n_in}, {"dy", n_out}, {"mask", 1}};
  throw std::invalid_argument("an AOTInductor package has no program " + model);
}

inline at::Tensor check(const std::string& model, const Argument& arg, const at::Tensor& t,
                        int64_t rows) {
  const std::string where = model + ": " + arg.name;
  if (t.scalar_type() != at::kFloat) {
    throw std::invalid_argument(where + " must be float32 (the package's only dtype), got " +
                                std::string(c10::toString(t.scalar_type())));
  }
  if (!t.device().is_cpu()) throw std::invalid_argument(where + " must be on the CPU");
  if (t.dim() != 2 || t.size(1) != arg.columns || t.size(0) != rows) {
    std::string shape = "[";
    for (int64_t d = 0; d < t.dim(); ++d) shape += (d ? ", " : "") + std::to_string(t.size(d));
    throw std::invalid_argument(where + " must be [" + std::to_string(rows) + ", " +
                                std::to_string(arg.columns) + "], got " + shape + "]");
  }
  return t.contiguous();
}

class Program {
 public:
  Program(const std::string& package, const std::string& model, int64_t n_in, int64_t n_out)
      : loader_(package, model), model_(model), args_(arguments(model, n_in, n_out)) {}

  std::vector<at::Tensor> run(const std::vector<at::Tensor>& tensors) {
    if (tensors.size() != args_.size()) {
      throw std::invalid_argument(model_ + " takes " + std::to_string(args_.size()) +
                                  " tensors, got " + std::to_string(tensors.size()));
    }
    const int64_t rows = tensors[0].dim() == 2 ? tensors[0].size(0) : -1;
    std::vector<at::Tensor> ready;
    for (size_t i = 0; i < tensors.size(); ++i) ready.push_back(check(model_, args_[i], tensors[i], rows));
    return loader_.run(ready);
  }

  // Unchecked: what a caller that calls the loader itself (SABER) gets.
  std::vector<at::Tensor> run_raw(const std::vector<at::Tensor>& tensors) {
    return loader_.run(tensors);
  }

  std::unordered_map<std::string, std::string> metadata() { return loader_.get_metadata(); }

 private:
  torch::inductor::AOTIModelPackageLoader loader_;
  std::string model_;
  std::vector<Argument> args_;
};

}  // namespace checked
