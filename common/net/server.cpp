#include "common/net/server.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <deque>
#include <filesystem>
#include <list>
#include <cerrno>
#include <cstring>
#include <set>
#include <type_traits>
#include <unordered_map>

#include "common/net/asio_access.hpp"
#include "common/net/beast_request.hpp"
#include "common/net/tls_util.hpp"

namespace corral::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using local = asio::local::stream_protocol;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;
// A connection on the local socket: plain HTTP, the kernel's file permissions and the
// token standing in for TLS.
using LocalStream = beast::basic_stream<local>;
template <class Stream>
constexpr bool kTls = std::is_same_v<Stream, TlsStream>;
// What a local connection counts as, in place of a client address.
constexpr const char* kLocalAddress = "local";

// Anything the server must be able to close at stop().
struct Closable {
  virtual ~Closable() = default;
  virtual void force_close() = 0;
};

// An HTTP connection's place in the server's budget: counted (in total and for its client
// address) from accept until it is closed or becomes an agent's WebSocket, and on the
// waiting list while it waits for its peer.
struct Slot : Closable {
  std::string address;
  bool counted = false;
  bool waiting = false;
  std::list<std::weak_ptr<Slot>>::iterator waiting_at;
};

// The local socket file's identity once bound: stop() removes the file only while it is
// still this one, not a successor's that took the path over.
struct SocketFile {
  dev_t dev = 0;
  ino_t ino = 0;
};

struct Server::Impl : std::enable_shared_from_this<Server::Impl> {
  Impl(asio::io_context& io_context, ServerOptions opts, ServerHandler& h)
      : io(io_context), acceptor(io_context), local_acceptor(io_context), accept_retry(io_context),
        local_accept_retry(io_context), options(std::move(opts)), handler(h) {}

  // Accepts on `on` for ever (until stop): a session per connection, made by `make`.
  template <class Acceptor, class Make>
  void accept(Acceptor& on, asio::steady_timer& retry, Make make);
  void accept_tls();
  void accept_local();

  asio::io_context& io;
  tcp::acceptor acceptor;
  local::acceptor local_acceptor;
  SocketFile local_file;  // the socket file bound, removed at stop() while still ours
  asio::steady_timer accept_retry;
  asio::steady_timer local_accept_retry;
  std::shared_ptr<ssl::context> tls;
  ServerOptions options;
  ServerHandler& handler;
  std::size_t live = 0;         // every session, HTTP and WebSocket
  std::size_t http_live = 0;    // counted HTTP sessions
  std::size_t agents_live = 0;  // WebSocket sessions
  std::size_t streams_live = 0;  // streamed answers
  std::unordered_map<std::string, std::size_t> per_address;
  std::unordered_map<std::string, std::size_t> streams_per_address;
  // HTTP sessions waiting for their peer, longest first: the ones closed for a newcomer.
  std::list<std::weak_ptr<Slot>> waiting;
  std::uint64_t evicted = 0;
  std::uint64_t refused = 0;
  bool stopped = false;
  // Every live session, to close at stop(); expired entries are swept as it grows.
  std::set<std::weak_ptr<Closable>, std::owner_less<std::weak_ptr<Closable>>> sessions;
  std::size_t sweep_at = 64;

  void track(const std::shared_ptr<Closable>& session) {
    sessions.insert(session);
    if (sessions.size() >= sweep_at) {
      std::erase_if(sessions, [](const auto& w) { return w.expired(); });
      sweep_at = std::max<std::size_t>(64, 2 * sessions.size());
    }
  }

  void count(Slot& slot) {
    slot.counted = true;
    ++http_live;
    ++per_address[slot.address];
  }

  // The slot leaves the budget: closed, evicted, or an agent's WebSocket now.
  void release(Slot& slot) {
    stop_waiting(slot);
    if (!slot.counted) return;
    slot.counted = false;
    --http_live;
    if (auto it = per_address.find(slot.address); it != per_address.end() && --it->second == 0) per_address.erase(it);
  }

  void start_waiting(const std::shared_ptr<Slot>& slot) {
    stop_waiting(*slot);
    if (!slot->counted) return;
    slot->waiting_at = waiting.insert(waiting.end(), slot);
    slot->waiting = true;
  }

  void stop_waiting(Slot& slot) {
    if (!slot.waiting) return;
    waiting.erase(slot.waiting_at);
    slot.waiting = false;
  }

  // Closes the connection that has waited longest (from `address`, when given).
  bool evict_one(const std::string* address) {
    for (auto it = waiting.begin(); it != waiting.end(); ++it) {
      auto slot = it->lock();
      if (!slot || (address != nullptr && slot->address != *address)) continue;
      release(*slot);
      slot->force_close();
      ++evicted;
      return true;
    }
    return false;
  }

  // Room for a newcomer from `address`, made by closing waiting connections if need be.
  bool make_room(const std::string& address) {
    auto it = per_address.find(address);
    if (it != per_address.end() && it->second >= options.max_connections_per_address && !evict_one(&address)) {
      return false;
    }
    return http_live < options.max_connections || evict_one(nullptr);
  }
};

namespace {

std::string endpoint_text(const tcp::socket& socket) {
  boost::system::error_code ec;
  auto ep = socket.remote_endpoint(ec);
  if (ec) return "unknown";
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}

std::string address_text(const tcp::socket& socket) {
  boost::system::error_code ec;
  auto ep = socket.remote_endpoint(ec);
  return ec ? std::string("unknown") : ep.address().to_string();
}

// A local client is known by its user (the kernel's SO_PEERCRED), so that one user's
// connections do not use up the budget of everyone else on the coordinator's machine.
std::string address_text(const local::socket& socket) {
  ucred peer{};
  socklen_t size = sizeof(peer);
  if (::getsockopt(const_cast<local::socket&>(socket).native_handle(), SOL_SOCKET, SO_PEERCRED, &peer, &size) != 0) {
    return kLocalAddress;
  }
  return std::string(kLocalAddress) + " uid " + std::to_string(peer.uid);
}

std::string json_error(const std::string& message) {
  std::string escaped;
  for (char c : message) {
    if (c == '"' || c == '\\') {
      escaped += '\\';
      escaped += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      escaped += ' ';
    } else {
      escaped += c;
    }
  }
  return "{\"error\":\"" + escaped + "\"}";
}

// ---------------------------------------------------------------- WebSocket

class WsSession final : public WsConnection, public Closable, public std::enable_shared_from_this<WsSession> {
 public:
  WsSession(std::shared_ptr<Server::Impl> server, TlsStream&& stream, std::string peer_cn, std::string remote)
      : server_(std::move(server)), ws_(std::move(stream)), peer_cn_(std::move(peer_cn)), remote_(std::move(remote)) {
    ++server_->live;
    ++server_->agents_live;
  }
  ~WsSession() override {
    --server_->live;
    --server_->agents_live;
  }

  void run(http::request<http::string_body> req) {
    beast::get_lowest_layer(ws_).expires_never();
    websocket::stream_base::timeout timeout;
    timeout.handshake_timeout = server_->options.handshake_timeout;
    timeout.idle_timeout = server_->options.ws_idle_timeout;
    timeout.keep_alive_pings = true;
    ws_.set_option(timeout);
    ws_.read_message_max(server_->options.max_ws_message_bytes);
    ws_.text(true);
    auto self = shared_from_this();
    ws_.async_accept(req, [self](beast::error_code ec) {
      if (ec) return self->finish();
      self->open_ = true;
      self->server_->handler.on_ws_open(self);
      self->read();
    });
  }

  void send(std::string text) override {
    if (!open_) return;
    queued_bytes_ += text.size();
    if (queued_bytes_ > server_->options.max_ws_queue_bytes) {
      close("send queue full");
      return;
    }
    queue_.push_back(std::move(text));
    if (queue_.size() == 1) write();
  }

  void close(const std::string& reason) override {
    if (!open_) return;
    open_ = false;
    closing_ = true;
    auto self = shared_from_this();
    websocket::close_reason cr(websocket::close_code::normal, reason.substr(0, 120));
    ws_.async_close(cr, [self](beast::error_code) { self->finish(); });
  }

  bool open() const override { return open_; }
  const std::string& peer_cn() const override { return peer_cn_; }
  const std::string& remote() const override { return remote_; }

  void force_close() override {
    open_ = false;
    boost::system::error_code ec;
    beast::get_lowest_layer(ws_).socket().close(ec);
  }

 private:
  void read() {
    auto self = shared_from_this();
    ws_.async_read(buffer_, [self](beast::error_code ec, std::size_t) {
      if (ec) return self->finish();
      std::string text = beast::buffers_to_string(self->buffer_.data());
      self->buffer_.consume(self->buffer_.size());
      if (self->open_) self->server_->handler.on_ws_message(self, std::move(text));
      if (self->open_) self->read();
    });
  }

  void write() {
    auto self = shared_from_this();
    ws_.async_write(asio::buffer(queue_.front()), [self](beast::error_code ec, std::size_t) {
      if (ec) return self->finish();
      self->queued_bytes_ -= self->queue_.front().size();
      self->queue_.pop_front();
      if (!self->queue_.empty() && !self->closing_) self->write();
    });
  }

  // Called once the connection is over, whichever way it ended.
  void finish() {
    if (finished_) return;
    finished_ = true;
    open_ = false;
    queue_.clear();
    server_->handler.on_ws_close(shared_from_this());
  }

  std::shared_ptr<Server::Impl> server_;
  websocket::stream<TlsStream> ws_;
  beast::flat_buffer buffer_;
  std::deque<std::string> queue_;
  std::size_t queued_bytes_ = 0;
  std::string peer_cn_;
  std::string remote_;
  bool open_ = false;
  bool closing_ = false;
  bool finished_ = false;
};

// ---------------------------------------------------------------- streamed answers

// A response whose body is written as events happen (text/event-stream). The connection
// carries nothing else: no length, `Connection: close`, and whatever the client sends is
// taken as its leaving. A write must finish within io_timeout.
template <class Stream>
class StreamSession final : public EventStream,
                            public Closable,
                            public std::enable_shared_from_this<StreamSession<Stream>> {
 public:
  StreamSession(std::shared_ptr<Server::Impl> server, Stream&& stream, std::string address)
      : server_(std::move(server)), stream_(std::move(stream)), address_(std::move(address)) {
    ++server_->live;
    ++server_->streams_live;
    ++server_->streams_per_address[address_];
    // A peer that vanished without a word: the pings it does not acknowledge end the
    // connection after io_timeout, not after TCP's retransmissions give up (~15 min).
    if constexpr (kTls<Stream>) {
      unsigned ms = static_cast<unsigned>(
          std::chrono::duration_cast<std::chrono::milliseconds>(server_->options.io_timeout).count());
      ::setsockopt(beast::get_lowest_layer(stream_).socket().native_handle(), IPPROTO_TCP, TCP_USER_TIMEOUT, &ms,
                   sizeof(ms));
    }
  }
  ~StreamSession() override { uncount(); }

  void run(const HttpResponse& res, unsigned version, const std::function<void(std::shared_ptr<EventStream>)>& opened) {
    std::string head = version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ";
    head += std::to_string(res.status) + (res.status == 200 ? " OK" : " Answer");
    head += "\r\nServer: corral\r\nContent-Type: " + res.content_type + "\r\nConnection: close\r\n";
    for (const auto& [name, value] : res.headers) head += name + ": " + value + "\r\n";
    head += "\r\n";
    open_ = true;
    // The read that watches for the client's leaving has no deadline; the request's read
    // left one on the stream, and a pending read keeps the expiry it started with. Writes
    // set their own (a pending read leaves the read timer alone).
    beast::get_lowest_layer(stream_).expires_never();
    watch();
    send(std::move(head) + res.body);
    opened(this->shared_from_this());
  }

  void send(std::string text) override {
    if (!open_ || text.empty()) return;
    queued_bytes_ += text.size();
    if (queued_bytes_ > server_->options.max_stream_queue_bytes) return close();
    queue_.push_back(std::move(text));
    if (queue_.size() == 1) write();
  }

  void close() override { force_close(); }
  bool open() const override { return open_; }

  // Closed, it stops counting at once: whoever sends to it may hold it until its next
  // send, and must not keep a newcomer out meanwhile.
  void force_close() override {
    open_ = false;
    // The front is what a write in progress still reads (a queue that is not empty has
    // one); its handler drops it.
    if (!queue_.empty()) queue_.erase(std::next(queue_.begin()), queue_.end());
    boost::system::error_code ec;
    beast::get_lowest_layer(stream_).socket().close(ec);
    uncount();
  }

 private:
  // The client says nothing on an event stream; a read that ends, in data, EOF or an
  // error, means it left.
  void watch() {
    auto self = this->shared_from_this();
    stream_.async_read_some(asio::buffer(scratch_), [self](beast::error_code, std::size_t) { self->force_close(); });
  }

  void write() {
    beast::get_lowest_layer(stream_).expires_after(server_->options.io_timeout);
    auto self = this->shared_from_this();
    asio::async_write(stream_, asio::buffer(queue_.front()), [self](beast::error_code ec, std::size_t) {
      if (ec || !self->open_) return self->force_close();
      self->queued_bytes_ -= self->queue_.front().size();
      self->queue_.pop_front();
      if (!self->queue_.empty()) return self->write();
      beast::get_lowest_layer(self->stream_).expires_never();
    });
  }

  void uncount() {
    if (!counted_) return;
    counted_ = false;
    --server_->live;
    --server_->streams_live;
    auto it = server_->streams_per_address.find(address_);
    if (it != server_->streams_per_address.end() && --it->second == 0) server_->streams_per_address.erase(it);
  }

  std::shared_ptr<Server::Impl> server_;
  Stream stream_;
  std::string address_;
  bool counted_ = true;
  std::array<char, 256> scratch_{};
  std::deque<std::string> queue_;
  std::size_t queued_bytes_ = 0;
  bool open_ = false;
};

}  // namespace

// ---------------------------------------------------------------- HTTP

// One client connection: TLS over TCP (Stream = TlsStream), or plain HTTP on the local
// socket (LocalStream), which carries no WebSocket.
template <class Stream>
class Session : public Slot, public std::enable_shared_from_this<Session<Stream>> {
 public:
  // `peer_address` is the accept's address_text(socket), worked out once.
  template <class Socket>
  Session(std::shared_ptr<Server::Impl> server, Socket&& socket, std::string peer_address)
      : server_(std::move(server)), first_byte_(server_->io) {
    address = std::move(peer_address);
    if constexpr (kTls<Stream>) {
      remote_ = endpoint_text(socket);
      tcp_.emplace(std::move(socket));
    } else {
      remote_ = address;  // a local client has no port: its user is all there is to name
      stream_.emplace(std::move(socket));
    }
    ++server_->live;
    server_->count(*this);
  }
  ~Session() override {
    --server_->live;
    server_->release(*this);
  }

  // The TLS stream (about 70 KiB of buffers in Asio's engine) is made once the client
  // sends its first byte: a connection that says nothing costs a socket and little more.
  void run() {
    auto self = this->shared_from_this();
    if constexpr (!kTls<Stream>) {
      read();
    } else {
      server_->start_waiting(self);
      const auto deadline = std::chrono::steady_clock::now() + server_->options.handshake_timeout;
      first_byte_.expires_at(deadline);
      first_byte_.async_wait([weak = this->weak_from_this()](beast::error_code ec) {
        if (auto s = weak.lock(); s && !ec) s->force_close();
      });
      tcp_->socket().async_wait(tcp::socket::wait_read, [self, deadline](beast::error_code ec) {
        self->first_byte_.cancel();
        if (ec || !self->tcp_->socket().is_open()) return;
        self->stream_.emplace(std::move(*self->tcp_), *self->server_->tls);
        self->tcp_.reset();
        beast::get_lowest_layer(*self->stream_).expires_at(deadline);
        self->stream_->async_handshake(ssl::stream_base::server, [self](beast::error_code ec2) {
          if (ec2) return;  // a failed handshake (wrong CA, not TLS) just drops the connection
          self->peer_cn_ = verified_peer_cn(self->stream_->native_handle());
          self->read();
        });
      });
    }
  }

  void force_close() override {
    boost::system::error_code ec;
    first_byte_.cancel();
    if (stream_) {
      beast::get_lowest_layer(*stream_).socket().close(ec);
    } else if (tcp_) {
      tcp_->socket().close(ec);
    }
  }

 private:
  // The request's headers within header_timeout (idle_timeout between requests), then
  // its body within io_timeout; the connection waits (and may be closed for a newcomer)
  // until the whole request is in.
  void read() {
    parser_.emplace();
    limit_parser(*parser_, server_->options.max_header_bytes, server_->options.max_body_bytes);
    beast::get_lowest_layer(*stream_).expires_after(first_request_ ? server_->options.header_timeout
                                                                  : server_->options.idle_timeout);
    first_request_ = false;
    auto self = this->shared_from_this();
    server_->start_waiting(self);
    http::async_read_header(*stream_, buffer_, *parser_, [self](beast::error_code ec, std::size_t) {
      if (ec) return self->read_failed(ec);
      if (self->parser_->is_done()) return self->dispatch(self->parser_->release());
      beast::get_lowest_layer(*self->stream_).expires_after(self->server_->options.io_timeout);
      http::async_read(*self->stream_, self->buffer_, *self->parser_, [self](beast::error_code ec2, std::size_t) {
        if (ec2) return self->read_failed(ec2);
        self->dispatch(self->parser_->release());
      });
    });
  }

  void read_failed(beast::error_code ec) {
    server_->stop_waiting(*this);
    if (ec == http::error::end_of_stream) return shutdown();
    if (ec == http::error::body_limit || ec == http::error::header_limit) {
      keep_alive_ = false;
      drain_after_write_ = true;
      return write({413, "application/json", json_error("request too large"), {}}, 11);
    }
    if (ec == beast::error::timeout || ec == asio::error::operation_aborted || ec == asio::error::eof ||
        ec == ssl::error::stream_truncated || !counted) {
      return;  // gone, timed out, or closed for a newcomer
    }
    // A malformed request gets an answer and the connection is closed.
    keep_alive_ = false;
    write({400, "application/json", json_error("bad request: " + ec.message()), {}}, 11);
  }

  void dispatch(http::request<http::string_body> req) {
    server_->stop_waiting(*this);  // being answered: never closed for a newcomer
    HttpRequest request = to_request(req, peer_cn_, remote_);
    keep_alive_ = req.keep_alive();
    unsigned version = req.version();
    if (request.path.empty()) {
      keep_alive_ = false;
      return write({400, "application/json", json_error("bad request target"), {}}, version);
    }
    if (websocket::is_upgrade(req)) {
      if constexpr (!kTls<Stream>) {
        keep_alive_ = false;
        return write({400, "application/json", json_error("agents connect over TLS, not the local socket"), {}},
                     version);
      } else {
        return upgrade(std::move(req), request, version);
      }
    }
    auto self = this->shared_from_this();
    auto responded = std::make_shared<bool>(false);
    server_->handler.on_http(request, [self, responded, version](HttpResponse res) {
      if (*responded) return;
      *responded = true;
      self->write(std::move(res), version);
    });
  }

  // An agent's WebSocket, on the path for it, once the handler accepts it.
  void upgrade(http::request<http::string_body> req, const HttpRequest& request, unsigned version) {
    if (request.path != server_->options.ws_path) {
      keep_alive_ = false;
      return write({404, "application/json", json_error("no WebSocket endpoint at " + request.path), {}}, version);
    }
    auto ok = server_->handler.accept_ws(request);
    if (!ok) {
      int status = ok.error().code() == ErrorCode::Unauthenticated ? 401 : 403;
      keep_alive_ = false;
      return write({status, "application/json", json_error(ok.error().message()), {}}, version);
    }
    if (server_->agents_live >= server_->options.max_agent_connections) {
      keep_alive_ = false;
      return write({503, "application/json", json_error("too many agent connections"), {}}, version);
    }
    // An agent's link now: counted apart from clients' connections.
    server_->release(*this);
    auto ws = std::make_shared<WsSession>(server_, std::move(*stream_), peer_cn_, remote_);
    stream_.reset();  // moved from: nothing of this session may touch it again
    server_->track(ws);
    ws->run(std::move(req));
  }

  void write(HttpResponse res, unsigned version) {
    if (res.stream) return start_stream(std::move(res), version);
    const int status = res.status;
    auto msg = std::make_shared<BeastResponse>(to_beast_response(std::move(res), version));
    msg->set(http::field::server, "corral");
    // A client refused for who it is or for what it sent does not keep its slot.
    if (status == 401 || status == 413) keep_alive_ = false;
    msg->keep_alive(keep_alive_);
    msg->prepare_payload();
    beast::get_lowest_layer(*stream_).expires_after(server_->options.io_timeout);
    auto self = this->shared_from_this();
    http::async_write(*stream_, *msg, [self, msg](beast::error_code ec, std::size_t) {
      if (ec) return;
      if (self->drain_after_write_) return self->drain(0);
      if (!self->keep_alive_) return self->shutdown();
      self->read();
    });
  }

  // The connection becomes the stream's, counted apart from HTTP connections.
  void start_stream(HttpResponse res, unsigned version) {
    auto mine = server_->streams_per_address.find(address);
    if (server_->streams_live >= server_->options.max_streams ||
        (mine != server_->streams_per_address.end() && mine->second >= server_->options.max_streams_per_address)) {
      keep_alive_ = false;
      return write({503, "application/json", json_error("too many event streams"), {}}, version);
    }
    server_->release(*this);
    auto stream = std::make_shared<StreamSession<Stream>>(server_, std::move(*stream_), address);
    stream_.reset();  // moved from: nothing of this session may touch it again
    server_->track(stream);
    stream->run(res, version, res.stream);
  }

  // After refusing a request whose body was not read, reads and drops what the client
  // still sends (bounded in bytes and in time: a client that sends nothing more loses the
  // connection after kDrainFor) before closing, so the client finishes its write and
  // reads the answer instead of meeting a connection reset.
  void drain(std::size_t drained) {
    constexpr std::size_t kMaxDrain = 64 * 1024 * 1024;
    constexpr auto kDrainFor = std::chrono::seconds(2);
    if (drained == 0) beast::get_lowest_layer(*stream_).expires_after(kDrainFor);
    auto self = this->shared_from_this();
    auto scratch = std::make_shared<std::array<char, 16384>>();
    stream_->async_read_some(asio::buffer(*scratch), [self, scratch, drained](beast::error_code ec, std::size_t n) {
      if (ec || drained + n > kMaxDrain) return self->shutdown();
      self->drain(drained + n);
    });
  }

  void shutdown() {
    if constexpr (kTls<Stream>) {
      beast::get_lowest_layer(*stream_).expires_after(std::chrono::seconds(5));
      auto self = this->shared_from_this();
      stream_->async_shutdown([self](beast::error_code) {});
    } else {
      boost::system::error_code ec;
      stream_->socket().shutdown(local::socket::shutdown_send, ec);
    }
  }

  std::shared_ptr<Server::Impl> server_;
  std::string remote_;
  std::optional<beast::tcp_stream> tcp_;  // TLS: until the first byte
  asio::steady_timer first_byte_;
  std::optional<Stream> stream_;          // TLS: from the first byte on
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string peer_cn_;
  bool keep_alive_ = true;
  bool first_request_ = true;
  bool drain_after_write_ = false;
};

template <class Acceptor, class Make>
void Server::Impl::accept(Acceptor& on, asio::steady_timer& retry, Make make) {
  auto self = shared_from_this();
  on.async_accept([self, &on, &retry, make](beast::error_code ec, typename Acceptor::protocol_type::socket socket) {
    if (self->stopped || ec == asio::error::operation_aborted) return;
    if (ec) {
      // Out of descriptors or memory (EMFILE, ENFILE, ENOBUFS): free one if a connection
      // waits, and try again shortly. The listener never stops accepting.
      self->evict_one(nullptr);
      retry.expires_after(std::chrono::milliseconds(50));
      retry.async_wait([self, &on, &retry, make](beast::error_code wait_ec) {
        if (!wait_ec && !self->stopped) self->accept(on, retry, make);
      });
      return;
    }
    std::string address = address_text(socket);
    if (!self->make_room(address)) {
      boost::system::error_code ignored;
      socket.close(ignored);  // every connection is being answered: refuse rather than grow
      ++self->refused;
    } else {
      make(self, std::move(socket), std::move(address));
    }
    self->accept(on, retry, make);
  });
}

void Server::Impl::accept_tls() {
  accept(acceptor, accept_retry, [](const std::shared_ptr<Impl>& self, tcp::socket socket, std::string address) {
    // Small messages (an Ack, then a Prepare) go out at once: with Nagle's algorithm the
    // second waits for the peer's delayed ACK, tens of milliseconds.
    boost::system::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    auto session = std::make_shared<Session<TlsStream>>(self, std::move(socket), std::move(address));
    self->track(session);
    session->run();
  });
}

void Server::Impl::accept_local() {
  accept(local_acceptor, local_accept_retry,
         [](const std::shared_ptr<Impl>& self, local::socket socket, std::string address) {
           auto session = std::make_shared<Session<LocalStream>>(self, std::move(socket), std::move(address));
           self->track(session);
           session->run();
         });
}

namespace {

// Binds the local socket at `path`: a socket file left by a coordinator that is gone is
// replaced; one another process still answers on, or a file that is no socket, is not.
// Whether a server answers on the socket at `path`: a non-blocking connect, so that a
// stuck server with a full backlog (EAGAIN) counts as there rather than hanging us.
// ECONNREFUSED: a file left by a server that is gone.
Result<bool> someone_listens(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return make_error(ErrorCode::Unavailable, std::strerror(errno));
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  int err = errno;
  ::close(fd);
  if (rc == 0 || err == EAGAIN || err == EINPROGRESS) return true;
  if (err == ECONNREFUSED || err == ENOENT) return false;
  return make_error(ErrorCode::Unavailable, "cannot tell whether a server answers there: " + std::string(std::strerror(err)));
}

// Binds the local socket at `path`: a socket file left by a coordinator that is gone is
// replaced; one another process still answers on, or a file that is no socket, is not.
Result<SocketFile> listen_local(local::acceptor& acceptor, const std::string& path) {
  const auto fail = [&](const std::string& why) {
    return make_error(ErrorCode::Unavailable, "cannot listen on the local socket " + path + ": " + why);
  };
  if (path.size() >= sizeof(sockaddr_un{}.sun_path)) return fail("the path is too long for a socket");
  // Its folder, as /run/corral after a reboot, is made when missing, 0755 whatever the
  // umask, so that other users can reach the socket.
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  if (!folder.empty()) {
    std::error_code made;
    if (std::filesystem::create_directories(folder, made)) {
      std::filesystem::permissions(folder, std::filesystem::perms(0755), made);
    }
    if (made) return fail(made.message());
  }
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return fail("a file that is not a socket is in the way");
    auto there = someone_listens(path);
    if (!there) return fail(there.error().message());
    if (*there) return fail("another process is listening on it");
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return fail(std::strerror(errno));
  }
  boost::system::error_code ec;
  acceptor.open(local(), ec);
  if (!ec) acceptor.bind(local::endpoint(path), ec);
  if (ec) return fail(ec.message());
  const auto undo = [&](const std::string& why) {
    ::unlink(path.c_str());
    return fail(why);
  };
  // Anyone on the machine may connect, as anyone may reach the TCP port: each request
  // still needs a token.
  if (::chmod(path.c_str(), 0666) != 0) return undo(std::strerror(errno));
  if (::lstat(path.c_str(), &st) != 0) return undo(std::strerror(errno));
  acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return undo(ec.message());
  return SocketFile{st.st_dev, st.st_ino};
}

}  // namespace

Server::Server(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() { stop(); }

Result<std::unique_ptr<Server>> Server::start(EventLoop& loop, ServerOptions options, ServerHandler& handler) {
  auto impl = std::make_shared<Impl>(io_of(loop), std::move(options), handler);
  auto tls = make_server_tls(impl->options.tls.ca, impl->options.tls.cert, impl->options.tls.key);
  if (!tls) return std::unexpected(tls.error());
  impl->tls = *tls;
  boost::system::error_code ec;
  auto address = asio::ip::make_address(impl->options.host, ec);
  if (ec) return make_error(ErrorCode::InvalidArgument, "invalid listen address " + impl->options.host);
  tcp::endpoint endpoint(address, static_cast<unsigned short>(impl->options.port));
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return make_error(ErrorCode::Unavailable, "cannot listen on " + impl->options.host + ":" +
                                                  std::to_string(impl->options.port) + ": " + ec.message());
  }
  if (!impl->options.local_socket.empty()) {
    auto bound = listen_local(impl->local_acceptor, impl->options.local_socket);
    if (!bound) return std::unexpected(bound.error());
    impl->local_file = *bound;
  }
  impl->accept_tls();
  if (impl->local_acceptor.is_open()) impl->accept_local();
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

int Server::port() const {
  boost::system::error_code ec;
  auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

std::size_t Server::connections() const { return impl_->live; }
std::uint64_t Server::evicted() const { return impl_->evicted; }
std::uint64_t Server::refused() const { return impl_->refused; }

void Server::stop() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  boost::system::error_code ec;
  impl_->acceptor.close(ec);
  impl_->accept_retry.cancel();
  if (impl_->local_acceptor.is_open()) {
    impl_->local_acceptor.close(ec);
    // Only our own file: a coordinator started meanwhile may have put its socket there.
    struct stat st {};
    const std::string& path = impl_->options.local_socket;
    if (::lstat(path.c_str(), &st) == 0 && st.st_dev == impl_->local_file.dev && st.st_ino == impl_->local_file.ino) {
      ::unlink(path.c_str());
    }
  }
  impl_->local_accept_retry.cancel();
  for (const auto& weak : impl_->sessions) {
    if (auto s = weak.lock()) s->force_close();
  }
  impl_->sessions.clear();
}

}  // namespace corral::net
