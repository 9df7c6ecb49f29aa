// Load the exported emulator (model.pt) the way JCSDA SABER's TorchBalance does: read the
// name and level attributes, call jac_physical on [N, n_in] float32 inputs with a
// [N, 1] float32 mask, read the [N, n_out, n_in] float32 result; then time predict.
// With --aoti, do the same through the AOTInductor package (model.pt2) with
// torch::inductor::AOTIModelPackageLoader, the path that does not need TorchScript.
//
//   emulator_jacobian MODEL.pt [--aoti MODEL.pt2] [--inputs FILE] [--mask FILE]
//                     [--input-units U1,U2,...] [--rows N] [--threads T] [--repeat R]
//                     [--jacobian-out FILE] [--predict-out FILE]
//                     [--aoti-jacobian-out FILE] [--aoti-predict-out FILE]
//                     [--aoti-probe] [--invariance]
//
// --aoti-probe: call the package with bad inputs (float64, 13 columns, a transposed view,
// a short mask, a 0-row mask or 0-row inputs beside 8 rows of the other) and with 0, 1
// and 7 rows, through the checked call (aoti_checked.h) and
// straight through the loader; report which of the two refused each ("probe").
// --invariance: each method (TorchScript and, with --aoti, the package) on all rows, then
// on a few rows alone; report how many of those rows differ in any bit ("invariance").
//
// --input-units: the units the caller's background holds, one per input in the module's
// order; any that differs from the module's input_units is an error (exit 2), never a
// silently wrong number. Each path reports its load time, its first call and the median
// of later calls (first_jacobian_ms, jacobian_ms, ...).
//
// FILE arguments are raw little-endian float32, row-major: inputs [N, n_in] (N follows
// from the size), mask [N]. Without --inputs, N rows are made from the module's own
// normalisation (mean + std * sin(...)), so the program runs on any export. One JSON
// object goes to stdout; --jacobian-out / --predict-out get the results as raw float32.
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/csrc/jit/runtime/jit_exception.h>
#include <torch/script.h>

#include "aoti_checked.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Options {
  std::string model;
  std::string inputs;
  std::string mask;
  std::string jacobian_out;
  std::string predict_out;
  std::string aoti;
  std::string aoti_jacobian_out;
  std::string aoti_predict_out;
  std::string input_units;
  int64_t rows = 1000;
  int threads = 1;
  int repeat = 20;
  bool probe = false;
  bool invariance = false;
};

Options parse(int argc, char** argv) {
  if (argc < 2) {
    throw std::invalid_argument(
        "usage: emulator_jacobian MODEL.pt [--aoti MODEL.pt2] [--inputs FILE] [--mask FILE] "
        "[--input-units U1,U2,...] [--rows N] [--threads T] [--repeat R] [--jacobian-out FILE] "
        "[--predict-out FILE] [--aoti-jacobian-out FILE] [--aoti-predict-out FILE]");
  }
  Options opt;
  opt.model = argv[1];
  for (int i = 2; i < argc; i += 2) {
    const std::string key = argv[i];
    if (key == "--aoti-probe" || key == "--invariance") {
      (key == "--aoti-probe" ? opt.probe : opt.invariance) = true;
      --i;  // a flag without a value
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(key + " needs a value");
    const std::string value = argv[i + 1];
    if (key == "--inputs") opt.inputs = value;
    else if (key == "--mask") opt.mask = value;
    else if (key == "--jacobian-out") opt.jacobian_out = value;
    else if (key == "--predict-out") opt.predict_out = value;
    else if (key == "--aoti") opt.aoti = value;
    else if (key == "--aoti-jacobian-out") opt.aoti_jacobian_out = value;
    else if (key == "--aoti-predict-out") opt.aoti_predict_out = value;
    else if (key == "--input-units") opt.input_units = value;
    else if (key == "--rows") opt.rows = std::stoll(value);
    else if (key == "--threads") opt.threads = std::stoi(value);
    else if (key == "--repeat") opt.repeat = std::stoi(value);
    else throw std::invalid_argument("unknown option " + key);
  }
  if (opt.rows < 1 || opt.threads < 1 || opt.repeat < 1) {
    throw std::invalid_argument("--rows, --threads and --repeat must be >= 1");
  }
  return opt;
}

std::vector<std::string> string_list(const torch::jit::Module& module, const char* name) {
  std::vector<std::string> out;
  if (!module.hasattr(name)) return out;
  for (const auto& item : module.attr(name).toListRef()) out.push_back(item.toStringRef());
  return out;
}

std::vector<int64_t> int_list(const torch::jit::Module& module, const char* name) {
  std::vector<int64_t> out;
  for (const auto& item : module.attr(name).toListRef()) out.push_back(item.toInt());
  return out;
}

// Raw float32 file -> [rows, cols] tensor (rows from the size when rows < 0).
torch::Tensor read_floats(const std::string& path, int64_t rows, int64_t cols) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw std::runtime_error("cannot read " + path);
  const auto bytes = static_cast<int64_t>(in.tellg());
  const int64_t row_bytes = cols * static_cast<int64_t>(sizeof(float));
  if (bytes % row_bytes != 0 || (rows >= 0 && bytes != rows * row_bytes)) {
    throw std::runtime_error(path + " holds " + std::to_string(bytes) +
                             " bytes, not whole rows of " + std::to_string(cols) + " float32");
  }
  auto out = torch::empty({bytes / row_bytes, cols}, torch::kFloat32);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(out.data_ptr<float>()), bytes);
  return out;
}

void write_floats(const std::string& path, const torch::Tensor& values) {
  const auto flat = values.to(torch::kFloat32).contiguous();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(flat.data_ptr<float>()),
            static_cast<std::streamsize>(flat.numel() * sizeof(float)));
  if (!out) throw std::runtime_error("cannot write " + path);
}

std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

template <typename T>
std::string json_list(const std::vector<T>& items) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out << ", ";
    if constexpr (std::is_same_v<T, std::string>) out << quoted(items[i]);
    else out << items[i];
  }
  out << "]";
  return out.str();
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, sep);) out.push_back(item);
  return out;
}

// The background's units must be the module's: SABER passes values, not units.
void check_units(const std::vector<std::string>& names, const std::vector<std::string>& want,
                 const std::string& given_text) {
  const auto given = split(given_text, ',');
  if (given.size() != want.size()) {
    throw std::invalid_argument("--input-units lists " + std::to_string(given.size()) +
                                " units, the module takes " + std::to_string(want.size()));
  }
  std::string wrong;
  for (size_t i = 0; i < want.size(); ++i) {
    if (given[i] != want[i]) {
      wrong += (wrong.empty() ? "" : "; ") + names[i] + " in " + given[i] + " (the module takes " +
               want[i] + ")";
    }
  }
  if (!wrong.empty()) throw std::invalid_argument("background units do not match: " + wrong);
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// Wall time of one call, in milliseconds (the first call of a path is timed with this).
template <typename F>
double once_ms(F&& call) {
  const auto start = std::chrono::steady_clock::now();
  call();
  return ms_since(start);
}

// Median wall time of `repeat` calls, in milliseconds.
template <typename F>
double median_ms(int repeat, F&& call) {
  call();  // warm-up: TorchScript optimises a method on its first calls
  call();
  std::vector<double> ms;
  for (int i = 0; i < repeat; ++i) {
    const auto start = std::chrono::steady_clock::now();
    call();
    ms.push_back(std::chrono::duration<double, std::milli>(
                     std::chrono::steady_clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

// Whether a call throws: "ok" or "refused".
template <typename F>
std::string outcome(F&& call) {
  try {
    call();
    return "ok";
  } catch (const std::exception&) {
    return "refused";
  }
}

// Bad inputs and small batches, through the checked call and straight through the loader.
std::string probe(checked::Program& program, const at::Tensor& inputs, const at::Tensor& mask) {
  const auto x = inputs.narrow(0, 0, 8).contiguous();
  const auto m = mask.narrow(0, 0, 8).contiguous();
  const std::vector<std::pair<std::string, std::vector<at::Tensor>>> cases = {
      {"float64", {x.to(at::kDouble), m}},
      {"13 columns", {x.narrow(1, 0, x.size(1) - 1).contiguous(), m}},
      {"transposed", {x.t().contiguous().t(), m}},
      {"short mask", {x, m.narrow(0, 0, 5)}},
      {"mask 0 rows", {x, m.narrow(0, 0, 0)}},
      {"inputs 0 rows", {x.narrow(0, 0, 0), m}},
      {"rows 0", {x.narrow(0, 0, 0), m.narrow(0, 0, 0)}},
      {"rows 1", {x.narrow(0, 0, 1), m.narrow(0, 0, 1)}},
      {"rows 7", {x.narrow(0, 0, 7), m.narrow(0, 0, 7)}},
  };
  std::ostringstream out;
  out << "{";
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& [name, args] = cases[i];
    out << (i ? ", " : "") << quoted(name) << ": {\"checked\": "
        << quoted(outcome([&] { program.run(args); }))
        << ", \"raw\": " << quoted(outcome([&] { program.run_raw(args); })) << "}";
  }
  return out.str() + "}";
}

// Rows whose bits differ between a call on all rows and a call on that row alone.
template <typename F>
int64_t differing_rows(F&& call, int64_t rows) {
  const auto all = call(0, rows);
  int64_t differ = 0;
  for (const int64_t row : {int64_t{0}, int64_t{1}, rows / 2, rows - 1}) {
    if (row < 0 || row >= rows) continue;
    if (!torch::equal(call(row, 1), all.narrow(0, row, 1))) ++differ;
  }
  return differ;
}

std::string invariance(torch::jit::Module& module, const Options& opt, const at::Tensor& x,
                       int64_t n_out) {
  c10::InferenceMode guard;
  const int64_t rows = x.size(0), n_in = x.size(1);
  const auto dx = torch::cos(torch::arange(rows * n_in, torch::kFloat32)).reshape({rows, n_in});
  const auto dy = torch::sin(torch::arange(rows * n_out, torch::kFloat32)).reshape({rows, n_out});
  const auto mask = torch::ones({rows, 1}, torch::kFloat32);
  std::ostringstream out;
  out << "{";
  const char* methods[] = {"predict", "jac_physical", "tlm", "adjoint"};
  for (int k = 0; k < 4; ++k) {
    const std::string name = methods[k];
    auto method = module.get_method(name);
    auto script = [&](int64_t start, int64_t count) {
      std::vector<c10::IValue> args{x.narrow(0, start, count)};
      if (name == "tlm") args.push_back(dx.narrow(0, start, count));
      if (name == "adjoint") args.push_back(dy.narrow(0, start, count));
      return method(args).toTensor();
    };
    out << (k ? ", " : "") << quoted("torchscript " + name) << ": " << differing_rows(script, rows);
    if (opt.aoti.empty()) continue;
    checked::Program program(opt.aoti, name, n_in, n_out);
    auto compiled = [&](int64_t start, int64_t count) {
      std::vector<at::Tensor> args{x.narrow(0, start, count)};
      if (name == "tlm") args.push_back(dx.narrow(0, start, count));
      if (name == "adjoint") args.push_back(dy.narrow(0, start, count));
      if (name != "predict") args.push_back(mask.narrow(0, start, count));
      return program.run(args).at(0);
    };
    out << ", " << quoted("aoti " + name) << ": " << differing_rows(compiled, rows);
  }
  return out.str() + "}";
}

int run(const Options& opt) {
  // One intra-op thread per MPI task is what a DA system running many tasks per node
  // wants; LibTorch would otherwise start one per core in every task.
  at::set_num_threads(opt.threads);

  const auto load_started = std::chrono::steady_clock::now();
  torch::jit::Module module = torch::jit::load(opt.model);
  module.eval();
  const double torchscript_load_ms = ms_since(load_started);
  const auto input_names = string_list(module, "input_names");
  const auto output_names = string_list(module, "output_names");
  const auto input_units = string_list(module, "input_units");
  const auto input_levels = int_list(module, "input_levels");
  const auto output_levels = int_list(module, "output_levels");
  const auto n_in = static_cast<int64_t>(input_names.size());
  const auto n_out = static_cast<int64_t>(output_names.size());
  if (!opt.input_units.empty()) check_units(input_names, input_units, opt.input_units);

  torch::Tensor inputs;
  if (!opt.inputs.empty()) {
    inputs = read_floats(opt.inputs, -1, n_in);
  } else {
    const auto mean = module.attr("input_mean").toTensor().to(torch::kFloat32);
    const auto std = module.attr("input_std").toTensor().to(torch::kFloat32);
    const auto i = torch::arange(opt.rows, torch::kFloat32).unsqueeze(1);
    const auto k = torch::arange(n_in, torch::kFloat32).unsqueeze(0);
    inputs = mean + std * torch::sin(0.7 * i + 1.3 * k);
  }
  const int64_t rows = inputs.size(0);
  // SABER passes the raw value of a mask field, or ones: [N, 1] float32.
  const torch::Tensor mask = opt.mask.empty() ? torch::ones({rows, 1}, torch::kFloat32)
                                              : read_floats(opt.mask, rows, 1);

  // As SABER does at set-up: plain grad mode, get_method, one call for all points.
  auto jac_method = module.get_method("jac_physical");
  torch::Tensor jac;
  const double first_jacobian_ms = once_ms([&] { jac = jac_method({inputs, mask}).toTensor(); });
  if (jac.dim() != 3 || jac.size(0) != rows || jac.size(1) != n_out || jac.size(2) != n_in) {
    throw std::runtime_error("jac_physical returned shape " + std::to_string(jac.dim()) +
                             "-d, expected [N, n_out, n_in]");
  }
  // jac[p][o][i] = d output o / d input i at point p (contiguous, row-major).
  double inference_diff = 0.0;
  double float64_diff = 0.0;
  bool float64_dtype = false;
  torch::Tensor prediction;
  double predict_ms = 0.0;
  double jacobian_ms = 0.0;
  double first_predict_ms = 0.0;
  {
    // After a grad-mode call: the export's parameters are frozen, so this works.
    c10::InferenceMode guard;
    inference_diff = max_abs_diff(jac_method({inputs, mask}).toTensor(), jac);
    const auto jac64 = jac_method({inputs.to(torch::kFloat64), mask}).toTensor();
    float64_dtype = jac64.scalar_type() == torch::kFloat64;
    float64_diff = max_abs_diff(jac64, jac);
    auto predict = module.get_method("predict");
    first_predict_ms = once_ms([&] { prediction = predict({inputs}).toTensor(); });
    predict_ms = median_ms(opt.repeat, [&] { predict({inputs}); });
    jacobian_ms = median_ms(opt.repeat, [&] { jac_method({inputs, mask}); });
  }
  if (!opt.jacobian_out.empty()) write_floats(opt.jacobian_out, jac);
  if (!opt.predict_out.empty()) write_floats(opt.predict_out, prediction);

  // The AOTInductor package: one compiled program per method, float32 in and out.
  std::ostringstream aoti_json;
  if (!opt.aoti.empty()) {
    c10::InferenceMode guard;
    const auto started = std::chrono::steady_clock::now();
    checked::Program aoti_jac(opt.aoti, "jac_physical", n_in, n_out);
    checked::Program aoti_predict(opt.aoti, "predict", n_in, n_out);
    const double load_ms = ms_since(started);
    const auto meta = aoti_jac.metadata();
    const bool has_signature = meta.count("signature.json") > 0;
    std::vector<at::Tensor> jac_out;
    const double first_jac = once_ms([&] { jac_out = aoti_jac.run({inputs, mask}); });
    std::vector<at::Tensor> pred_out;
    const double first_pred = once_ms([&] { pred_out = aoti_predict.run({inputs}); });
    const double aoti_jac_ms = median_ms(opt.repeat, [&] { aoti_jac.run({inputs, mask}); });
    const double aoti_pred_ms = median_ms(opt.repeat, [&] { aoti_predict.run({inputs}); });
    const auto& ajac = jac_out.at(0);
    if (!opt.aoti_jacobian_out.empty()) write_floats(opt.aoti_jacobian_out, ajac);
    if (!opt.aoti_predict_out.empty()) write_floats(opt.aoti_predict_out, pred_out.at(0));
    const auto flags = pred_out.at(1).to(torch::kInt64);
    aoti_json << ", \"aoti\": {\"load_ms\": " << load_ms
              << ", \"first_jacobian_ms\": " << first_jac << ", \"jacobian_ms\": " << aoti_jac_ms
              << ", \"first_predict_ms\": " << first_pred << ", \"predict_ms\": " << aoti_pred_ms
              << ", \"jacobian_max_diff\": " << max_abs_diff(ajac, jac)
              << ", \"predict_outputs\": " << pred_out.size()
              << ", \"flagged_rows\": " << (flags != 0).sum().item<int64_t>()
              << ", \"cpu_isa\": " << quoted(meta.count("cpu_isa") ? meta.at("cpu_isa") : "")
              << ", \"metadata_has_signature\": " << (has_signature ? "true" : "false") << "}";
    if (opt.probe) aoti_json << ", \"probe\": " << probe(aoti_jac, inputs, mask);
  }
  if (opt.invariance) aoti_json << ", \"invariance\": " << invariance(module, opt, inputs, n_out);

  std::cout << std::setprecision(10) << "{\"input_names\": " << json_list(input_names)
            << ", \"input_levels\": " << json_list(input_levels)
            << ", \"input_units\": " << json_list(input_units)
            << ", \"output_names\": " << json_list(output_names)
            << ", \"output_levels\": " << json_list(output_levels)
            << ", \"rows\": " << rows << ", \"threads\": " << at::get_num_threads()
            << ", \"jacobian_shape\": [" << jac.size(0) << ", " << jac.size(1) << ", "
            << jac.size(2) << "], \"jacobian_dtype\": "
            << quoted(std::string(c10::toString(jac.scalar_type())))
            << ", \"jacobian_sum\": " << jac.to(torch::kFloat64).sum().item<double>()
            << ", \"inference_mode_max_diff\": " << inference_diff
            << ", \"float64_dtype\": " << (float64_dtype ? "true" : "false")
            << ", \"float64_max_diff\": " << float64_diff
            << ", \"torchscript_load_ms\": " << torchscript_load_ms
            << ", \"first_jacobian_ms\": " << first_jacobian_ms
            << ", \"first_predict_ms\": " << first_predict_ms
            << ", \"predict_ms\": " << predict_ms << ", \"jacobian_ms\": " << jacobian_ms
            << ", \"predict_rows_per_s\": " << (predict_ms > 0 ? rows / predict_ms * 1e3 : 0)
            << aoti_json.str() << "}" << std::endl;
  return 0;
}

// The first line of an error: c10::Error's message carries a C++ backtrace after it.
std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const torch::jit::JITException& exc) {
    // A method that raised (jac_physical refusing a background mostly out of its training
    // range, with the counts): what() starts with the interpreter's traceback, the
    // method's own message is the original one.
    std::cerr << "error: " << first_line(exc.getOriginalMsg().value_or(exc.what())) << std::endl;
    return 2;
  } catch (const std::exception& exc) {
    std::cerr << "error: " << first_line(exc.what()) << std::endl;
    return 2;
  }
}
