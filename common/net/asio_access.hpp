#pragma once
// Internal to common/net: reaches the io_context behind an EventLoop. Never include
// this outside common/net.

#include <boost/asio/io_context.hpp>

#include "common/net/event_loop.hpp"

namespace corral::net {

inline boost::asio::io_context& io_of(EventLoop& loop) {
  return *static_cast<boost::asio::io_context*>(loop.native());
}

}  // namespace corral::net
