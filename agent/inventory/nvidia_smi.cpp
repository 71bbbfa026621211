#include "agent/inventory/nvidia_smi.hpp"

#include "common/core/strings.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <initializer_list>
#include <set>

namespace corral::agent {

namespace {

constexpr std::string_view kSpaces = " \t\r\n";

std::string_view trim(std::string_view text) {
  const auto first = text.find_first_not_of(kSpaces);
  if (first == std::string_view::npos) return {};
  const auto last = text.find_last_not_of(kSpaces);
  return text.substr(first, last - first + 1);
}

// Lines without their "\n" or "\r\n"; a final newline does not make an extra line.
std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  std::size_t start = 0;
  while (start < text.size()) {
    auto end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    start = end + 1;
  }
  return lines;
}

std::vector<std::string_view> split_fields(std::string_view line, char separator) {
  std::vector<std::string_view> fields;
  std::size_t start = 0;
  while (true) {
    const auto end = line.find(separator, start);
    fields.push_back(trim(line.substr(start, end == std::string_view::npos ? end : end - start)));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return fields;
}

std::vector<std::string_view> split_words(std::string_view line) {
  std::vector<std::string_view> words;
  std::size_t pos = 0;
  while (true) {
    const auto first = line.find_first_not_of(kSpaces, pos);
    if (first == std::string_view::npos) break;
    auto last = line.find_first_of(kSpaces, first);
    if (last == std::string_view::npos) last = line.size();
    words.push_back(line.substr(first, last - first));
    pos = last;
  }
  return words;
}

// For messages: the text as printed, control characters escaped, cut at 100 characters.
std::string excerpt(std::string_view text) {
  std::string out = "\"";
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (i == 100) {
      out += "...";
      break;
    }
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      constexpr std::string_view kHex = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}


// nvidia-smi's ways of saying "no value": "[N/A]", "[Not Supported]", "[Unknown Error]",
// "[Insufficient Permissions]", "[GPU requires reset]"; some versions drop the brackets.
bool is_missing(std::string_view field) {
  return (field.size() >= 2 && field.front() == '[' && field.back() == ']') || field == "N/A" ||
         field.empty();
}

// "GPU3" -> 3.
std::optional<int> gpu_label_index(std::string_view word) {
  if (word.size() < 4 || word.substr(0, 3) != "GPU") return std::nullopt;
  auto index = parse_int<int>(word.substr(3));
  if (!index || *index < 0) return std::nullopt;
  return index;
}

// "NV12" -> true. "NV#" only appears in the legend.
bool is_nvlink_cell(std::string_view cell) {
  if (cell.size() < 3 || cell.substr(0, 2) != "NV") return false;
  auto links = parse_int<int>(cell.substr(2));
  return links.has_value() && *links > 0;
}

// Drops "ESC [ params letter": newer drivers underline the topo header even in a pipe.
std::string strip_ansi(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\x1b' && i + 1 < text.size() && text[i + 1] == '[') {
      std::size_t j = i + 2;
      while (j < text.size() && ((text[j] >= '0' && text[j] <= '9') || text[j] == ';')) ++j;
      if (j < text.size()) {
        i = j;  // also skips the final letter
        continue;
      }
    }
    out += text[i];
  }
  return out;
}

Error line_error(std::string_view what, std::size_t line, const std::string& message) {
  return Error(ErrorCode::InvalidArgument,
               std::string(what) + " line " + std::to_string(line) + ": " + message);
}

// The token after the first of `labels` found, up to a space or '|': "CUDA Version: 12.4 |"
// -> "12.4". Drivers from 610 on renamed the labels, so callers pass both spellings.
std::optional<std::string_view> banner_value(std::string_view text,
                                             std::initializer_list<std::string_view> labels) {
  for (std::string_view label : labels) {
    const auto at = text.find(label);
    if (at == std::string_view::npos) continue;
    std::string_view rest = text.substr(at + label.size());
    const auto first = rest.find_first_not_of(" \t");
    if (first == std::string_view::npos) return std::string_view{};
    rest = rest.substr(first);
    return rest.substr(0, rest.find_first_of(" \t\r\n|"));
  }
  return std::nullopt;
}

// The first non-blank lines of what a failed nvidia-smi printed, joined with " ".
std::string first_lines(std::string_view text, std::size_t max_lines) {
  std::string joined;
  std::size_t taken = 0;
  for (auto line : split_lines(text)) {
    line = trim(line);
    if (line.empty()) continue;
    if (!joined.empty()) joined += ' ';
    joined += line;
    if (++taken == max_lines || joined.size() > 400) break;
  }
  if (joined.size() > 400) joined = joined.substr(0, 400) + "...";
  return joined;
}

// The rows of a --query-* CSV answer, each split into `count` fields (`names` says which,
// for the error); blank lines, and `skip` (what some drivers print instead of nothing),
// are passed over. The first row with another count of fields is the error.
struct CsvRow {
  std::size_t line_no;
  std::vector<std::string_view> fields;
};

Result<std::vector<CsvRow>> query_rows(std::string_view csv, std::string_view what, std::size_t count,
                                       std::string_view names, std::string_view skip = {}) {
  std::vector<CsvRow> rows;
  const auto lines = split_lines(csv);
  for (std::size_t n = 0; n < lines.size(); ++n) {
    const std::string_view line = trim(lines[n]);
    if (line.empty() || (!skip.empty() && line == skip)) continue;
    auto fields = split_fields(line, ',');
    if (fields.size() != count) {
      return std::unexpected(line_error(what, n + 1,
                                        "expected " + std::to_string(count) + " fields (" + std::string(names) +
                                            "), got " + std::to_string(fields.size()) + ": " + excerpt(line)));
    }
    rows.push_back({n + 1, std::move(fields)});
  }
  return rows;
}

}  // namespace

Result<std::vector<GpuRow>> parse_query_gpu(std::string_view csv) {
  constexpr std::string_view kWhat = "nvidia-smi --query-gpu output";
  constexpr std::array<std::string_view, 6> kNames = {"index",        "uuid",           "name",
                                                      "memory.total", "driver_version", "pci.bus_id"};
  std::vector<GpuRow> rows;
  std::set<int> indices;
  std::set<std::string_view> uuids;
  auto csv_rows = query_rows(csv, kWhat, kNames.size(),
                             std::string(kNames.front()) + ", ..., " + std::string(kNames.back()));
  if (!csv_rows) return std::unexpected(csv_rows.error());
  for (const auto& [line_no, fields] : *csv_rows) {
    for (std::size_t f = 0; f < fields.size(); ++f) {
      if (is_missing(fields[f])) {
        return std::unexpected(
            line_error(kWhat, line_no, std::string(kNames[f]) + " is not available: " + excerpt(fields[f])));
      }
    }
    GpuRow row;
    auto index = parse_int<int>(fields[0]);
    if (!index || *index < 0 || *index > 1023) {
      return std::unexpected(
          line_error(kWhat, line_no, "index must be an integer from 0 to 1023, got " + excerpt(fields[0])));
    }
    auto memory = parse_int<std::int64_t>(fields[3]);
    if (!memory || *memory <= 0 || *memory > (std::int64_t{1} << 40)) {
      return std::unexpected(line_error(kWhat, line_no,
                                        "memory.total must be a positive number of MiB, got " +
                                            excerpt(fields[3]) + " (was --format missing nounits?)"));
    }
    if (!indices.insert(*index).second) {
      return std::unexpected(
          line_error(kWhat, line_no, "GPU index " + std::to_string(*index) + " listed twice"));
    }
    if (!uuids.insert(fields[1]).second) {
      return std::unexpected(line_error(kWhat, line_no, "GPU UUID " + excerpt(fields[1]) + " listed twice"));
    }
    row.index = *index;
    row.uuid = fields[1];
    row.name = fields[2];
    row.memory_mib = *memory;
    row.driver = fields[4];
    row.pci_bus_id = fields[5];
    rows.push_back(std::move(row));
  }
  return rows;
}

Result<model::CudaVersion> parse_cuda_version(std::string_view nvidia_smi_banner) {
  auto value = banner_value(nvidia_smi_banner, {"CUDA Version:", "CUDA UMD Version:"});
  if (!value) {
    if (is_driver_not_answering(nvidia_smi_banner)) {
      return make_error(ErrorCode::Unavailable, first_lines(nvidia_smi_banner, 2));
    }
    return make_error(ErrorCode::InvalidArgument,
                      "nvidia-smi output has no \"CUDA Version:\" or \"CUDA UMD Version:\" in its header "
                      "(drivers before 410 print none)");
  }
  // "N/A" in the table, "Not Found" (cut here at its space) in some: libcuda is missing.
  if (*value == "N/A" || *value == "Not") {
    return make_error(ErrorCode::Unavailable,
                      std::string("nvidia-smi reports \"CUDA Version: ") +
                          (*value == "N/A" ? "N/A" : "Not Found") +
                          "\": the driver's CUDA library is not installed or not visible here");
  }
  auto cuda = model::CudaVersion::parse(*value);
  if (!cuda || value->find('.') == std::string_view::npos) {
    return make_error(ErrorCode::InvalidArgument,
                      "nvidia-smi header: CUDA Version must be MAJOR.MINOR, got " + excerpt(*value));
  }
  return *cuda;
}

Result<std::string> parse_banner_driver(std::string_view nvidia_smi_banner) {
  auto value = banner_value(nvidia_smi_banner, {"Driver Version:", "KMD Version:"});
  if (!value || value->empty()) {
    if (is_driver_not_answering(nvidia_smi_banner)) {
      return make_error(ErrorCode::Unavailable, first_lines(nvidia_smi_banner, 2));
    }
    return make_error(ErrorCode::InvalidArgument,
                      "nvidia-smi output has no \"Driver Version:\" or \"KMD Version:\" in its header");
  }
  return std::string(*value);
}

Result<std::map<int, std::vector<int>>> parse_topo_nvlink(std::string_view topo_m) {
  constexpr std::string_view kWhat = "nvidia-smi topo -m output";
  const std::string text = strip_ansi(topo_m);
  const auto lines = split_lines(text);

  // The header is the first line that starts with "GPU<n>" and is not itself a row (a
  // row's second word is its diagonal "X"): "\tGPU0\tGPU1\tNIC0\tCPU Affinity\t...".
  std::size_t header_at = lines.size();
  for (std::size_t n = 0; n < lines.size(); ++n) {
    const auto words = split_words(lines[n]);
    if (!words.empty() && gpu_label_index(words[0]) && (words.size() < 2 || words[1] != "X")) {
      header_at = n;
      break;
    }
  }
  if (header_at == lines.size()) {
    return make_error(ErrorCode::InvalidArgument,
                      std::string(kWhat) + ": no matrix header (\"GPU0 GPU1 ...\")");
  }

  // Device columns (GPUs and NICs: "NIC0" or, from older drivers, "mlx5_0") come first;
  // "CPU Affinity", "NUMA Affinity" and "GPU NUMA ID" end them.
  std::vector<std::optional<int>> columns;  // the GPU index of each device column
  std::set<int> header_gpus;
  for (auto word : split_words(lines[header_at])) {
    if (word == "CPU" || word == "NUMA" || word == "GPU") break;
    auto gpu = gpu_label_index(word);
    if (gpu && !header_gpus.insert(*gpu).second) {
      return std::unexpected(
          line_error(kWhat, header_at + 1, std::string(word) + " appears twice in the header"));
    }
    columns.push_back(gpu);
  }

  std::map<int, std::vector<int>> peers;
  for (std::size_t n = header_at + 1; n < lines.size(); ++n) {
    const auto words = split_words(lines[n]);
    // The matrix ends at the blank line before "Legend:".
    if (words.empty() || words[0] == "Legend:") break;
    auto row_gpu = gpu_label_index(words[0]);
    if (!row_gpu) continue;  // a NIC row
    if (!header_gpus.contains(*row_gpu)) {
      return std::unexpected(
          line_error(kWhat, n + 1, std::string(words[0]) + " is not a column of the header"));
    }
    if (peers.contains(*row_gpu)) {
      return std::unexpected(line_error(kWhat, n + 1, std::string(words[0]) + " has two rows"));
    }
    if (words.size() - 1 < columns.size()) {
      return std::unexpected(line_error(kWhat, n + 1,
                                        std::string(words[0]) + " has " + std::to_string(words.size() - 1) +
                                            (words.size() == 2 ? " cell" : " cells") + "; the header has " +
                                            std::to_string(columns.size()) + " device columns"));
    }
    std::vector<int>& row_peers = peers[*row_gpu];
    for (std::size_t c = 0; c < columns.size(); ++c) {
      const std::string_view cell = words[c + 1];
      if (!columns[c]) continue;
      if (*columns[c] == *row_gpu) {
        if (cell != "X") {
          return std::unexpected(line_error(
              kWhat, n + 1, std::string(words[0]) + " should be X against itself, got " + excerpt(cell)));
        }
        continue;
      }
      if (is_nvlink_cell(cell)) row_peers.push_back(*columns[c]);
    }
    std::sort(row_peers.begin(), row_peers.end());
  }
  for (int gpu : header_gpus) {
    if (!peers.contains(gpu)) {
      return make_error(ErrorCode::InvalidArgument, std::string(kWhat) + ": the header lists GPU" +
                                                        std::to_string(gpu) + " but it has no row");
    }
  }
  return peers;
}

Result<std::vector<ComputeApp>> parse_compute_apps(std::string_view csv) {
  constexpr std::string_view kWhat = "nvidia-smi --query-compute-apps output";
  std::vector<ComputeApp> apps;
  // Some driver versions say so in words instead of printing nothing.
  auto rows = query_rows(csv, kWhat, 3, "pid, gpu_uuid, used_memory", "No running processes found");
  if (!rows) return std::unexpected(rows.error());
  for (const auto& [line_no, fields] : *rows) {
    ComputeApp app{std::nullopt, std::string(fields[1]), std::nullopt};
    // A process the driver will not name ("[Insufficient Permissions]") still holds its GPU.
    if (!is_missing(fields[0])) {
      auto pid = parse_int<int>(fields[0]);
      if (!pid || *pid <= 0) {
        return std::unexpected(
            line_error(kWhat, line_no, "pid must be a positive integer, got " + excerpt(fields[0])));
      }
      app.pid = *pid;
    }
    if (is_missing(fields[1])) {
      return std::unexpected(line_error(kWhat, line_no, "gpu_uuid is not available: " + excerpt(fields[1])));
    }
    if (!is_missing(fields[2])) {
      auto used = parse_int<std::int64_t>(fields[2]);
      if (!used || *used < 0) {
        return std::unexpected(
            line_error(kWhat, line_no, "used_memory must be a number of MiB, got " + excerpt(fields[2])));
      }
      app.used_memory_mib = *used;
    }
    apps.push_back(std::move(app));
  }
  return apps;
}

Result<std::map<int, int>> parse_gpu_utilization(std::string_view csv) {
  constexpr std::string_view kWhat = "nvidia-smi --query-gpu=index,utilization.gpu output";
  std::map<int, int> busy;
  auto rows = query_rows(csv, kWhat, 2, "index, utilization.gpu");
  if (!rows) return std::unexpected(rows.error());
  for (const auto& [line_no, fields] : *rows) {
    auto index = parse_int<int>(fields[0]);
    if (!index || *index < 0) {
      return std::unexpected(
          line_error(kWhat, line_no, "index must be a GPU index, got " + excerpt(fields[0])));
    }
    if (is_missing(fields[1])) continue;
    auto percent = parse_int<int>(fields[1]);
    if (!percent || *percent < 0 || *percent > 100) {
      return std::unexpected(line_error(
          kWhat, line_no, "utilization.gpu must be a percent from 0 to 100, got " + excerpt(fields[1])));
    }
    if (!busy.emplace(*index, *percent).second) {
      return std::unexpected(
          line_error(kWhat, line_no, "GPU index " + std::to_string(*index) + " listed twice"));
    }
  }
  return busy;
}

Result<std::vector<model::Gpu>> assemble_gpus(const std::vector<GpuRow>& rows, model::CudaVersion cuda,
                                              const std::map<int, std::vector<int>>& nvlink) {
  std::set<int> indices;
  for (const auto& row : rows) {
    if (!indices.insert(row.index).second) {
      return make_error(ErrorCode::InvalidArgument,
                        "GPU index " + std::to_string(row.index) + " listed twice");
    }
    if (row.driver != rows.front().driver) {
      // One kernel module serves every GPU; two versions mean the output is not one node's.
      return make_error(ErrorCode::InvalidArgument,
                        "GPUs report different drivers: " + rows.front().driver + " and " + row.driver);
    }
  }
  std::vector<model::Gpu> gpus;
  gpus.reserve(rows.size());
  for (const auto& row : rows) {
    model::Gpu gpu;
    gpu.index = row.index;
    gpu.uuid = row.uuid;
    gpu.pci_bus_id = row.pci_bus_id;
    gpu.cls = model::GpuClass{row.name, row.memory_mib, row.driver};
    gpu.cuda = cuda;
    if (auto it = nvlink.find(row.index); it != nvlink.end()) {
      for (int peer : it->second) {
        if (peer != row.index && indices.contains(peer)) gpu.nvlink_peers.push_back(peer);
      }
      std::sort(gpu.nvlink_peers.begin(), gpu.nvlink_peers.end());
      gpu.nvlink_peers.erase(std::unique(gpu.nvlink_peers.begin(), gpu.nvlink_peers.end()),
                             gpu.nvlink_peers.end());
    }
    gpus.push_back(std::move(gpu));
  }
  std::sort(gpus.begin(), gpus.end(),
            [](const model::Gpu& a, const model::Gpu& b) { return a.index < b.index; });
  return gpus;
}

bool is_driver_not_answering(std::string_view output) {
  constexpr std::array<std::string_view, 8> kSigns = {
      "couldn't communicate with the NVIDIA driver",
      "could not communicate with the NVIDIA driver",
      "Failed to initialize NVML",
      "Driver/library version mismatch",
      "No devices were found",
      "Unable to determine the device handle",
      "GPU is lost",
      "NVML: Driver Not Loaded",
  };
  return std::any_of(kSigns.begin(), kSigns.end(),
                     [output](std::string_view sign) { return output.find(sign) != std::string_view::npos; });
}

Error nvidia_smi_failure(std::string_view command, const CommandOutput& output) {
  std::string message(command);
  if (output.signal != 0) {
    message += " was killed by signal " + std::to_string(output.signal);
  } else {
    message += " exited with status " + std::to_string(output.exit_code);
  }
  // nvidia-smi prints its own errors on stdout; stderr only in some versions.
  std::string said = first_lines(output.out, 3);
  if (said.empty() || (!is_driver_not_answering(output.out) && is_driver_not_answering(output.err))) {
    said = first_lines(output.err, 3);
  }
  if (!said.empty()) message += ": " + said;
  return Error(ErrorCode::Unavailable, std::move(message));
}

}  // namespace corral::agent
