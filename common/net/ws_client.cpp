#include "common/net/ws_client.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <deque>

#include "common/net/asio_access.hpp"
#include "common/net/tls_util.hpp"

namespace corral::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;

namespace {

// One connection attempt and, if it succeeds, the open link.
class Link : public std::enable_shared_from_this<Link> {
 public:
  Link(asio::io_context& io, ssl::context& tls, const WsClientOptions& options, Url url, WsClient::Handlers& handlers)
      : resolver_(io), ws_(io, tls), options_(options), url_(std::move(url)), handlers_(handlers) {}

  void start() {
    auto self = shared_from_this();
    resolver_.async_resolve(url_.host, std::to_string(url_.port),
                            [self](beast::error_code ec, tcp::resolver::results_type results) {
                              if (ec) return self->fail("cannot resolve " + self->url_.host + ": " + ec.message());
                              self->connect(results);
                            });
  }

  void connect(const tcp::resolver::results_type& results) {
    auto self = shared_from_this();
    beast::get_lowest_layer(ws_).expires_after(options_.connect_timeout);
    beast::get_lowest_layer(ws_).async_connect(results, [self](beast::error_code ec, const tcp::endpoint&) {
      if (ec) return self->fail("cannot connect: " + ec.message());
      boost::system::error_code ignored;  // as the server: no Nagle delay on small messages
      auto& socket = beast::get_lowest_layer(self->ws_).socket();
      socket.set_option(tcp::no_delay(true), ignored);
      const unsigned int unacked_ms = static_cast<unsigned int>(self->options_.unacked_timeout.count());
      if (::setsockopt(socket.native_handle(), IPPROTO_TCP, TCP_USER_TIMEOUT, &unacked_ms, sizeof(unacked_ms)) != 0) {
        return self->fail(std::string("cannot set TCP_USER_TIMEOUT: ") + std::strerror(errno));
      }
      if (!set_sni(self->ws_.next_layer().native_handle(), self->url_.host)) {
        return self->fail("cannot set TLS server name");
      }
      self->ws_.next_layer().set_verify_callback(ssl::host_name_verification(self->url_.host));
      self->ws_.next_layer().async_handshake(ssl::stream_base::client, [self](beast::error_code ec2) {
        if (ec2) return self->fail("TLS handshake failed: " + ec2.message());
        self->upgrade();
      });
    });
  }

  void upgrade() {
    beast::get_lowest_layer(ws_).expires_never();
    websocket::stream_base::timeout timeout;
    timeout.handshake_timeout = options_.connect_timeout;
    timeout.idle_timeout = options_.idle_timeout;
    timeout.keep_alive_pings = true;
    ws_.set_option(timeout);
    ws_.read_message_max(options_.max_message_bytes);
    ws_.text(true);
    auto self = shared_from_this();
    std::string host = url_.host + ":" + std::to_string(url_.port);
    ws_.async_handshake(res_, host, options_.path, [self](beast::error_code ec) {
      if (ec) {
        // Only a response that came and was no 101 is a refusal with a status; any other
        // failure (with TLS 1.3, the coordinator's verdict on our certificate arrives
        // here, as an alert) says what it was.
        std::string why = "WebSocket upgrade failed: " + ec.message();
        if (ec == websocket::error::upgrade_declined) {
          why = "WebSocket upgrade refused with HTTP " + std::to_string(self->res_.result_int());
          if (!self->res_.body().empty()) why += ": " + self->res_.body();
        }
        return self->fail(why);
      }
      self->open_ = true;
      if (self->handlers_.on_open) self->handlers_.on_open();
      self->read();
    });
  }

  void read() {
    auto self = shared_from_this();
    ws_.async_read(buffer_, [self](beast::error_code ec, std::size_t) {
      if (ec) return self->fail(ec == websocket::error::closed ? "closed by the coordinator" : ec.message());
      std::string text = beast::buffers_to_string(self->buffer_.data());
      self->buffer_.consume(self->buffer_.size());
      if (self->handlers_.on_message && !self->done_) self->handlers_.on_message(std::move(text));
      if (!self->done_) self->read();
    });
  }

  void send(std::string text) {
    if (!open_ || done_) return;
    queued_ += text.size();
    if (queued_ > options_.max_queue_bytes) return fail("send queue full");
    queue_.push_back(std::move(text));
    if (queue_.size() == 1) write();
  }

  void write() {
    auto self = shared_from_this();
    ws_.async_write(asio::buffer(queue_.front()), [self](beast::error_code ec, std::size_t) {
      if (ec) return self->fail("write failed: " + ec.message());
      self->queued_ -= self->queue_.front().size();
      self->queue_.pop_front();
      if (!self->queue_.empty() && !self->done_) self->write();
    });
  }

  void close() {
    if (done_) return;
    done_ = true;
    open_ = false;
    auto self = shared_from_this();
    if (ws_.is_open()) {
      ws_.async_close(websocket::close_code::normal, [self](beast::error_code) {});
    } else {
      boost::system::error_code ec;
      beast::get_lowest_layer(ws_).socket().close(ec);
    }
  }

  bool open() const { return open_ && !done_; }

 private:
  void fail(const std::string& reason) {
    if (done_) return;
    done_ = true;
    open_ = false;
    queue_.clear();
    boost::system::error_code ec;
    beast::get_lowest_layer(ws_).socket().close(ec);
    if (handlers_.on_close) handlers_.on_close(reason);
  }

  tcp::resolver resolver_;
  websocket::stream<beast::ssl_stream<beast::tcp_stream>> ws_;
  const WsClientOptions& options_;
  Url url_;
  WsClient::Handlers& handlers_;
  websocket::response_type res_;
  beast::flat_buffer buffer_;
  std::deque<std::string> queue_;
  std::size_t queued_ = 0;
  bool open_ = false;
  bool done_ = false;
};

}  // namespace

struct WsClient::Impl {
  Impl(EventLoop& l, WsClientOptions o, Handlers h) : loop(l), options(std::move(o)), handlers(std::move(h)) {}
  EventLoop& loop;
  WsClientOptions options;
  Handlers handlers;
  std::shared_ptr<ssl::context> tls;
  std::shared_ptr<Link> link;
  std::string setup_error;
};

WsClient::WsClient(EventLoop& loop, WsClientOptions options, Handlers handlers)
    : impl_(std::make_shared<Impl>(loop, std::move(options), std::move(handlers))) {
  auto tls = make_client_tls(impl_->options.tls.ca, impl_->options.tls.cert, impl_->options.tls.key);
  if (tls) {
    impl_->tls = *tls;
  } else {
    impl_->setup_error = tls.error().message();
  }
}

WsClient::~WsClient() {
  // Callbacks must not reach a destroyed owner.
  impl_->handlers = {};
  if (impl_->link) impl_->link->close();
}

void WsClient::connect() {
  if (impl_->link) impl_->link->close();
  impl_->link.reset();
  auto url = parse_https_url(impl_->options.url);
  if (!impl_->tls) {
    // Loaded again on every attempt: a CA or certificate being replaced, or not there
    // yet, is picked up once it is whole (the caller's reconnect backoff paces this).
    auto tls = make_client_tls(impl_->options.tls.ca, impl_->options.tls.cert, impl_->options.tls.key);
    if (tls) {
      impl_->tls = *tls;
      impl_->setup_error.clear();
    } else {
      impl_->setup_error = tls.error().message();
    }
  }
  std::string error = impl_->setup_error;
  if (error.empty() && !url) error = "not an https://host:port URL: " + impl_->options.url;
  if (!error.empty()) {
    impl_->loop.post([impl = impl_, error] {
      if (impl->handlers.on_close) impl->handlers.on_close(error);
    });
    return;
  }
  impl_->link = std::make_shared<Link>(io_of(impl_->loop), *impl_->tls, impl_->options, *url, impl_->handlers);
  impl_->link->start();
}

bool WsClient::open() const { return impl_->link && impl_->link->open(); }

void WsClient::send(std::string text) {
  if (impl_->link) impl_->link->send(std::move(text));
}

void WsClient::close() {
  if (impl_->link) impl_->link->close();
}

}  // namespace corral::net
