/* bench/tls_floor: the least a process holds in memory for one verified TLS connection
 * made with the system's OpenSSL, as the agent makes it: OpenSSL's default
 * initialisation (the system's config, its error strings), a client context with the CA,
 * a client certificate and key, one TLS handshake with the coordinator. Then it waits
 * until its standard input closes, so that bench/vs_slurm.py can read its memory beside
 * the agent's and slurmd's. In C, with no library but OpenSSL's and libc's, so that what
 * it holds is OpenSSL's floor and nothing of corral's.
 *
 *   tls_floor HOST PORT CA CERT KEY
 *
 * Prints "connected TLSv1.3" once the handshake is done; exits 1 with OpenSSL's errors
 * otherwise.
 */
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int fail(const char* what) {
  fprintf(stderr, "tls_floor: %s\n", what);
  ERR_print_errors_fp(stderr);
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: tls_floor HOST PORT CA CERT KEY\n");
    return 2;
  }
  const char *host = argv[1], *port = argv[2];
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (ctx == NULL) return fail("SSL_CTX_new");
  if (SSL_CTX_load_verify_locations(ctx, argv[3], NULL) != 1) return fail("cannot load the CA");
  if (SSL_CTX_use_certificate_chain_file(ctx, argv[4]) != 1) return fail("cannot load the certificate");
  if (SSL_CTX_use_PrivateKey_file(ctx, argv[5], SSL_FILETYPE_PEM) != 1) return fail("cannot load the key");
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);

  struct addrinfo hints, *ai = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_STREAM;
  int rc = getaddrinfo(host, port, &hints, &ai);
  if (rc != 0) {
    fprintf(stderr, "tls_floor: cannot resolve %s:%s: %s\n", host, port, gai_strerror(rc));
    return 1;
  }
  int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
  if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
    perror("tls_floor: connect");
    return 1;
  }
  freeaddrinfo(ai);
  SSL* ssl = SSL_new(ctx);
  if (ssl == NULL || SSL_set_fd(ssl, fd) != 1) return fail("SSL_new");
  SSL_set_tlsext_host_name(ssl, host);
  if (SSL_set1_host(ssl, host) != 1) return fail("SSL_set1_host");
  if (SSL_connect(ssl) != 1) return fail("handshake");
  printf("connected %s\n", SSL_get_version(ssl));
  fflush(stdout);
  char buf[64];
  while (read(STDIN_FILENO, buf, sizeof buf) > 0) {
  }
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  close(fd);
  return 0;
}
