// One HTTP request read as the coordinator's server reads it (its header and body
// limits), then the handler's view of it: headers, repeats, the decoded target.
#include <cstdlib>

#include "common/net/http_parse.hpp"
#include "fuzz/fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto r = corral::net::parse_http_request(corral::fuzz::text(data, size), 16 * 1024, 1024 * 1024);
  if (r) {
    // What the API looks at first.
    (void)r->header("authorization");
    (void)r->header_count("authorization");
    if (r->body.size() > 1024 * 1024) std::abort();  // past the body limit
  } else if (r.error().message().empty()) {
    std::abort();
  }
  return 0;
}
