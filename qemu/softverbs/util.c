/* Small helpers: time, buffers, GID text, files, event fds. */
#include "softverbs.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

uint64_t sv_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

struct sv_buf *sv_buf_new(uint32_t len)
{
	struct sv_buf *b = malloc(sizeof(*b) + len);

	if (!b)
		return NULL;
	b->refs = 1;
	b->len = len;
	return b;
}

void sv_buf_put(struct sv_buf *b)
{
	if (b && --b->refs == 0)
		free(b);
}

/* Node names are [A-Za-z0-9_.-]+, short enough for a socket path. */
int sv_valid_node_name(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > 64 || strcmp(s, ".") == 0 || strcmp(s, "..") == 0)
		return 0;
	for (; *s; s++) {
		char c = *s;
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-'))
			return 0;
	}
	return 1;
}

void sv_gid_hex(const union ibv_gid *gid, char out[33])
{
	static const char digits[] = "0123456789abcdef";

	for (int i = 0; i < 16; i++) {
		out[2 * i] = digits[gid->raw[i] >> 4];
		out[2 * i + 1] = digits[gid->raw[i] & 15];
	}
	out[32] = 0;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Parses exactly 32 hex digits, optionally followed by whitespace. */
int sv_gid_parse(const char *hex, union ibv_gid *gid)
{
	for (int i = 0; i < 16; i++) {
		int hi = hexval(hex[2 * i]), lo;

		if (hi < 0)
			return -1;
		lo = hexval(hex[2 * i + 1]);
		if (lo < 0)
			return -1;
		gid->raw[i] = (uint8_t)(hi << 4 | lo);
	}
	for (const char *p = hex + 32; *p; p++)
		if (*p != '\n' && *p != ' ' && *p != '\r' && *p != '\t')
			return -1;
	return 0;
}

int sv_gid_is_zero(const union ibv_gid *gid)
{
	for (int i = 0; i < 16; i++)
		if (gid->raw[i])
			return 0;
	return 1;
}

/* Writes text to path through a temporary file and rename(2), so readers
 * see either the old or the new content. */
int sv_write_file_atomic(const char *path, const char *text)
{
	char tmp[1024];
	size_t len = strlen(text);
	int fd;

	if (snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid()) >=
	    (int)sizeof(tmp))
		return -ENAMETOOLONG;
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	if (write(fd, text, len) != (ssize_t)len) {
		int e = errno ? errno : EIO;
		close(fd);
		unlink(tmp);
		return -e;
	}
	close(fd);
	if (rename(tmp, path) < 0) {
		int e = errno;
		unlink(tmp);
		return -e;
	}
	return 0;
}

/* mkdir -p */
int sv_mkdirs(const char *path)
{
	char buf[1024];
	size_t n = strlen(path);

	if (n == 0 || n >= sizeof(buf))
		return -ENAMETOOLONG;
	memcpy(buf, path, n + 1);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(buf, 0755) < 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	if (mkdir(buf, 0755) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

/* Event fds are created with EFD_SEMAPHORE: the counter equals the number
 * of queued events, so the fd is readable exactly while events wait. */
void sv_event_signal(int fd)
{
	uint64_t one = 1;

	while (write(fd, &one, sizeof(one)) < 0 && errno == EINTR)
		;
}

/* Takes one count without blocking (used when queued events are purged). */
void sv_event_consume(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	uint64_t v;

	if (poll(&p, 1, 0) == 1 && (p.revents & POLLIN))
		while (read(fd, &v, sizeof(v)) < 0 && errno == EINTR)
			;
}
