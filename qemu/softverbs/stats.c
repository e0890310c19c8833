/*
 * Counters of what the fabric dropped or refused, by reason, readable by
 * other processes while this one runs and after it is killed.
 *
 * A node's counters live in one shared file mapping, $FABRIC/stats/<node>
 * (outside the node's directory, which its owner removes): the bench reads
 * it when a run fails to say where a message went. Layout (little endian):
 *
 *   0   8 bytes  "SVSTATS1"
 *   8   u32      number of counters N
 *   12  u32      0
 *   16  N x { char name[24] (NUL-padded); u64 value }
 *
 * Values are updated with relaxed atomic adds; a reader sees each counter
 * whole. Counting costs one add per event and never a system call.
 *
 * SOFTVERBS_DROP_UD=N[,M...] is a test hook: the node drops the Nth (and
 * Mth...) UD datagram addressed to one of its QPs, counted from 1, as if it
 * had been lost on the wire, and counts it as drop_injected.
 */
#include "softverbs.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static const char *const sv_stat_names[SV_ST_COUNT] = {
	[SV_ST_UD_SENT] = "ud_sent",
	[SV_ST_UD_DELIVERED] = "ud_delivered",
	[SV_ST_DROP_NO_ROUTE] = "drop_no_route",
	[SV_ST_DROP_UNREACHABLE] = "drop_unreachable",
	[SV_ST_DROP_BACKLOG] = "drop_backlog",
	[SV_ST_DROP_CONN_LOST] = "drop_conn_lost",
	[SV_ST_DROP_NO_QP] = "drop_no_qp",
	[SV_ST_DROP_QP_STATE] = "drop_qp_state",
	[SV_ST_DROP_QKEY] = "drop_qkey",
	[SV_ST_DROP_NOT_PEER] = "drop_not_peer",
	[SV_ST_DROP_NO_RECV] = "drop_no_recv",
	[SV_ST_DROP_INJECTED] = "drop_injected",
	[SV_ST_BAD_FRAME] = "bad_frame",
	[SV_ST_CONN_LOST] = "conn_lost",
	[SV_ST_RC_NAK_RNR] = "rc_nak_rnr",
	[SV_ST_RC_NAK_NOT_READY] = "rc_nak_not_ready",
	[SV_ST_RC_NAK_NOT_YET] = "rc_nak_not_yet",
	[SV_ST_RC_FAILED] = "rc_failed",
	[SV_ST_RC_NO_ROUTE] = "rc_no_route",
	[SV_ST_RC_UNREACHABLE] = "rc_unreachable",
};

#define SV_STAT_NAME 24
#define SV_STAT_HDR 16
#define SV_STAT_ENTRY (SV_STAT_NAME + 8)
#define SV_STAT_BYTES (SV_STAT_HDR + SV_ST_COUNT * SV_STAT_ENTRY)

/* The mapping, or NULL (no fabric yet, or it could not be made: counting
 * is then a no-op, never an error). */
static uint8_t *sv_stat_map;

/* The test hook's datagram numbers, ascending, and the count so far. */
#define SV_DROP_MAX 16
static uint64_t sv_drop_at[SV_DROP_MAX];
static int sv_drop_n;
static uint64_t sv_ud_seen;

void sv_stat_add(enum sv_stat s, uint64_t n)
{
	uint8_t *m = __atomic_load_n(&sv_stat_map, __ATOMIC_ACQUIRE);

	if (m && s < SV_ST_COUNT)
		__atomic_fetch_add((uint64_t *)(m + SV_STAT_HDR + s * SV_STAT_ENTRY +
					       SV_STAT_NAME), n, __ATOMIC_RELAXED);
}

static void sv_drop_hook_init(void)
{
	const char *v = getenv("SOFTVERBS_DROP_UD");
	char *end;

	sv_drop_n = 0;
	sv_ud_seen = 0;
	while (v && *v && sv_drop_n < SV_DROP_MAX) {
		unsigned long long k = strtoull(v, &end, 10);

		if (end == v)
			break;
		if (k > 0)
			sv_drop_at[sv_drop_n++] = k;
		v = *end == ',' ? end + 1 : end;
		if (*end != ',')
			break;
	}
}

int sv_drop_hook(void)
{
	sv_ud_seen++;
	for (int i = 0; i < sv_drop_n; i++) {
		if (sv_drop_at[i] == sv_ud_seen) {
			sv_stat_add(SV_ST_DROP_INJECTED, 1);
			return 1;
		}
	}
	return 0;
}

/* Opens (or creates) this node's counters. Called locked when the node
 * comes up; a failure only disables counting. Counters survive a restart
 * of the node in the same run: they add up. */
void sv_stats_open(void)
{
	char dir[700], path[900];
	uint8_t *m;
	int fd;

	sv_drop_hook_init();
	if (sv_stat_map)
		return;
	snprintf(dir, sizeof(dir), "%s/stats", sv.fabric);
	if (sv_mkdirs(dir) != 0)
		return;
	snprintf(path, sizeof(path), "%s/%s", dir, sv.node);
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	if (ftruncate(fd, SV_STAT_BYTES) != 0) {
		close(fd);
		return;
	}
	m = mmap(NULL, SV_STAT_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED)
		return;
	if (memcmp(m, "SVSTATS1", 8) != 0) {
		memset(m, 0, SV_STAT_BYTES);
		for (int i = 0; i < SV_ST_COUNT; i++)
			strncpy((char *)m + SV_STAT_HDR + i * SV_STAT_ENTRY,
				sv_stat_names[i], SV_STAT_NAME - 1);
		m[8] = SV_ST_COUNT;
		__atomic_thread_fence(__ATOMIC_RELEASE);
		memcpy(m, "SVSTATS1", 8);
	}
	__atomic_store_n(&sv_stat_map, m, __ATOMIC_RELEASE);
}

/* After fork the child is not this node: it must not count into the
 * parent's file. The mapping is inherited; drop it. */
void sv_stats_forget(void)
{
	uint8_t *m = sv_stat_map;

	__atomic_store_n(&sv_stat_map, NULL, __ATOMIC_RELEASE);
	if (m)
		munmap(m, SV_STAT_BYTES);
}
