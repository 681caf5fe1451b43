/*
 * The minimal ping-pong on loopback TCP that nfs_load's raw floor is checked
 * against: blocking sockets, TCP_NODELAY, one write and one read per message
 * on each side, client and server in two processes.
 *
 *   pingpong CALL_BYTES REPLY_BYTES SECONDS [PORT]
 *
 * prints: round trips/s and the p50 round trip in microseconds. With PORT,
 * only the client runs, against a server already listening on
 * 127.0.0.1:PORT that answers each call with REPLY_BYTES.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static void nodelay(int fd)
{
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int main(int argc, char **argv)
{
	if (argc != 4 && argc != 5) {
		fprintf(stderr, "usage: pingpong CALL_BYTES REPLY_BYTES SECONDS [PORT]\n");
		return 2;
	}
	size_t call = atoi(argv[1]), reply = atoi(argv[2]);
	double seconds = atof(argv[3]);
	static char buf[1 << 16];
	if (call < 8 || reply == 0 || call > sizeof buf || reply > sizeof buf)
		return 2;
	struct sockaddr_in a = { .sin_family = AF_INET };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	pid_t server = -1;
	int l = -1;
	if (argc == 5) {
		a.sin_port = htons(atoi(argv[4]));
	} else {
		l = socket(AF_INET, SOCK_STREAM, 0);
		socklen_t len = sizeof a;
		if (bind(l, (void *)&a, sizeof a) || listen(l, 1) ||
		    getsockname(l, (void *)&a, &len)) {
			perror("listen");
			return 1;
		}
		server = fork();
		if (server != 0)
			close(l);
	}
	if (server == 0) {
		int c = accept(l, 0, 0);
		nodelay(c);
		for (;;) {
			if (read(c, buf, sizeof buf) <= 0 || write(c, buf, reply) != (ssize_t)reply)
				_exit(0);
		}
	}
	int s = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(s, (void *)&a, sizeof a)) {
		perror("connect");
		return 1;
	}
	nodelay(s);
	/* A server that never answers ends the run instead of hanging it. */
	struct timeval limit = { .tv_sec = 5 };
	setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
	size_t cap = 10 * 1000 * 1000, n = 0;
	double *lat = malloc(cap * sizeof *lat);
	/* One RPC record: the last-fragment bit and the length after the mark. */
	memset(buf, 0, call);
	uint32_t mark = htonl(0x80000000u | (uint32_t)(call - 4));
	memcpy(buf, &mark, 4);
	double start = now(), end = start + seconds;
	while (n < cap) {
		double t = now();
		if (t >= end)
			break;
		if (write(s, buf, call) != (ssize_t)call)
			return 1;
		size_t got = 0;
		while (got < reply) {
			ssize_t r = read(s, buf, reply - got);
			if (r <= 0)
				return 1;
			got += r;
		}
		lat[n++] = now() - t;
	}
	double elapsed = now() - start;
	close(s);
	if (server > 0) {
		kill(server, SIGTERM);
		waitpid(server, 0, 0);
	}
	qsort(lat, n, sizeof *lat, cmp);
	printf("%.0f %.1f\n", n / elapsed, n ? lat[n / 2] * 1e6 : 0.0);
	return 0;
}
