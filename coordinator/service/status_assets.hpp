#pragma once
// The status page's files (coordinator/service/status_page/), compiled in.

#include <string_view>

namespace corral::service {

std::string_view status_html();    // index.html
std::string_view status_script();  // status.js

}  // namespace corral::service
