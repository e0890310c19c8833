/*
 * The parts of the libibverbs API that need no device of their own: names
 * of enum values, rates, fork hooks, sysfs helpers, address handles from a
 * received completion (through the library's ibv_query_port, ibv_query_gid
 * and ibv_create_ah), and the calls neither library supports (multicast,
 * L2 resolution: EOPNOTSUPP).
 */
#include "abi.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <unistd.h>

#define ABI_NAME(tab, v) \
	((unsigned)(v) < sizeof(tab) / sizeof(tab[0]) && tab[v] ? tab[v] : "unknown")

ABI_EXPORT const char *ibv_wc_status_str(enum ibv_wc_status status)
{
	static const char *const names[] = {
		[IBV_WC_SUCCESS] = "success",
		[IBV_WC_LOC_LEN_ERR] = "local length error",
		[IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
		[IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
		[IBV_WC_LOC_PROT_ERR] = "local protection error",
		[IBV_WC_WR_FLUSH_ERR] = "work request flushed",
		[IBV_WC_MW_BIND_ERR] = "memory window bind error",
		[IBV_WC_BAD_RESP_ERR] = "bad response",
		[IBV_WC_LOC_ACCESS_ERR] = "local access error",
		[IBV_WC_REM_INV_REQ_ERR] = "remote invalid request",
		[IBV_WC_REM_ACCESS_ERR] = "remote access error",
		[IBV_WC_REM_OP_ERR] = "remote operation error",
		[IBV_WC_RETRY_EXC_ERR] = "transport retries exceeded",
		[IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retries exceeded",
		[IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation",
		[IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
		[IBV_WC_REM_ABORT_ERR] = "remote abort",
		[IBV_WC_INV_EECN_ERR] = "invalid EE context number",
		[IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
		[IBV_WC_FATAL_ERR] = "fatal error",
		[IBV_WC_RESP_TIMEOUT_ERR] = "response timeout",
		[IBV_WC_GENERAL_ERR] = "general error",
		[IBV_WC_TM_ERR] = "tag matching error",
		[IBV_WC_TM_RNDV_INCOMPLETE] = "tag matching rendezvous incomplete",
	};
	return ABI_NAME(names, status);
}

ABI_EXPORT const char *ibv_event_type_str(enum ibv_event_type event)
{
	static const char *const names[] = {
		[IBV_EVENT_CQ_ERR] = "CQ error",
		[IBV_EVENT_QP_FATAL] = "QP fatal error",
		[IBV_EVENT_QP_REQ_ERR] = "QP invalid request",
		[IBV_EVENT_QP_ACCESS_ERR] = "QP access error",
		[IBV_EVENT_COMM_EST] = "communication established",
		[IBV_EVENT_SQ_DRAINED] = "send queue drained",
		[IBV_EVENT_PATH_MIG] = "path migrated",
		[IBV_EVENT_PATH_MIG_ERR] = "path migration failed",
		[IBV_EVENT_DEVICE_FATAL] = "device fatal error",
		[IBV_EVENT_PORT_ACTIVE] = "port active",
		[IBV_EVENT_PORT_ERR] = "port error",
		[IBV_EVENT_LID_CHANGE] = "LID changed",
		[IBV_EVENT_PKEY_CHANGE] = "P_Key table changed",
		[IBV_EVENT_SM_CHANGE] = "subnet manager changed",
		[IBV_EVENT_SRQ_ERR] = "SRQ error",
		[IBV_EVENT_SRQ_LIMIT_REACHED] = "SRQ limit reached",
		[IBV_EVENT_QP_LAST_WQE_REACHED] = "last WQE reached",
		[IBV_EVENT_CLIENT_REREGISTER] = "client reregistration",
		[IBV_EVENT_GID_CHANGE] = "GID table changed",
		[IBV_EVENT_WQ_FATAL] = "WQ fatal error",
	};
	return ABI_NAME(names, event);
}

ABI_EXPORT const char *ibv_node_type_str(enum ibv_node_type node_type)
{
	static const char *const names[] = {
		[IBV_NODE_CA] = "InfiniBand channel adapter",
		[IBV_NODE_SWITCH] = "InfiniBand switch",
		[IBV_NODE_ROUTER] = "InfiniBand router",
		[IBV_NODE_RNIC] = "iWARP NIC",
		[IBV_NODE_USNIC] = "usNIC",
		[IBV_NODE_USNIC_UDP] = "usNIC UDP",
		[IBV_NODE_UNSPECIFIED] = "unspecified",
	};
	return ABI_NAME(names, node_type);
}

ABI_EXPORT const char *ibv_port_state_str(enum ibv_port_state port_state)
{
	static const char *const names[] = {
		[IBV_PORT_NOP] = "PORT_NOP",
		[IBV_PORT_DOWN] = "PORT_DOWN",
		[IBV_PORT_INIT] = "PORT_INIT",
		[IBV_PORT_ARMED] = "PORT_ARMED",
		[IBV_PORT_ACTIVE] = "PORT_ACTIVE",
		[IBV_PORT_ACTIVE_DEFER] = "PORT_ACTIVE_DEFER",
	};
	return ABI_NAME(names, port_state);
}

/* ---- rates: enum value, multiple of 2.5 Gb/s, Mb/s ---- */

static const struct {
	enum ibv_rate rate;
	int mult;
	int mbps;
} abi_rates[] = {
	{ IBV_RATE_2_5_GBPS, 1, 2500 },     { IBV_RATE_5_GBPS, 2, 5000 },
	{ IBV_RATE_10_GBPS, 4, 10000 },     { IBV_RATE_20_GBPS, 8, 20000 },
	{ IBV_RATE_30_GBPS, 12, 30000 },    { IBV_RATE_40_GBPS, 16, 40000 },
	{ IBV_RATE_60_GBPS, 24, 60000 },    { IBV_RATE_80_GBPS, 32, 80000 },
	{ IBV_RATE_120_GBPS, 48, 120000 },  { IBV_RATE_14_GBPS, 0, 14062 },
	{ IBV_RATE_56_GBPS, 0, 56250 },     { IBV_RATE_112_GBPS, 0, 112500 },
	{ IBV_RATE_168_GBPS, 0, 168750 },   { IBV_RATE_25_GBPS, 0, 25781 },
	{ IBV_RATE_100_GBPS, 0, 103125 },   { IBV_RATE_200_GBPS, 0, 206250 },
	{ IBV_RATE_300_GBPS, 0, 309375 },   { IBV_RATE_28_GBPS, 0, 28125 },
	{ IBV_RATE_50_GBPS, 0, 53125 },     { IBV_RATE_400_GBPS, 0, 425000 },
	{ IBV_RATE_600_GBPS, 0, 637500 },   { IBV_RATE_800_GBPS, 0, 850000 },
	{ IBV_RATE_1200_GBPS, 0, 1275000 },
};
#define ABI_NRATES (sizeof(abi_rates) / sizeof(abi_rates[0]))

ABI_EXPORT int ibv_rate_to_mult(enum ibv_rate rate)
{
	for (size_t i = 0; i < ABI_NRATES; i++)
		if (abi_rates[i].rate == rate)
			return abi_rates[i].mult ? abi_rates[i].mult : -1;
	return -1;
}

ABI_EXPORT enum ibv_rate mult_to_ibv_rate(int mult)
{
	for (size_t i = 0; i < ABI_NRATES; i++)
		if (abi_rates[i].mult && abi_rates[i].mult == mult)
			return abi_rates[i].rate;
	return IBV_RATE_MAX;
}

ABI_EXPORT int ibv_rate_to_mbps(enum ibv_rate rate)
{
	for (size_t i = 0; i < ABI_NRATES; i++)
		if (abi_rates[i].rate == rate)
			return abi_rates[i].mbps;
	return -1;
}

ABI_EXPORT enum ibv_rate mbps_to_ibv_rate(int mbps)
{
	for (size_t i = 0; i < ABI_NRATES; i++)
		if (abi_rates[i].mbps == mbps)
			return abi_rates[i].rate;
	return IBV_RATE_MAX;
}

/* ---- fork: nothing to protect (softverbs pins nothing; the drop-in
 * supports no fork of a process that holds a device) ---- */

ABI_EXPORT int ibv_fork_init(void) { return 0; }
ABI_EXPORT enum ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }

ABI_EXPORT int ibv_dontfork_range(void *base, size_t size)
{
	(void)base; (void)size;
	return 0;
}

ABI_EXPORT int ibv_dofork_range(void *base, size_t size)
{
	(void)base; (void)size;
	return 0;
}

/* ---- sysfs helpers (the device itself has no sysfs entries) ---- */

ABI_EXPORT const char *ibv_get_sysfs_path(void)
{
	const char *p = getenv("SYSFS_PATH");

	return p && *p ? p : "/sys";
}

/* Reads dir/file into buf; returns the length without a trailing newline,
 * or -1. */
ABI_EXPORT int ibv_read_sysfs_file(const char *dir, const char *file, char *buf,
				  size_t size)
{
	char path[1024];
	ssize_t n;
	int fd;

	if (!dir || !file || !buf || size == 0 ||
	    snprintf(path, sizeof(path), "%s/%s", dir, file) >= (int)sizeof(path))
		return -1;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	n = read(fd, buf, size);
	close(fd);
	if (n <= 0)
		return -1;
	if ((size_t)n == size)
		n--;
	buf[n] = 0;
	if (n > 0 && buf[n - 1] == '\n')
		buf[--n] = 0;
	return (int)n;
}

/* ---- address handles from a received completion ---- */

ABI_EXPORT int ibv_init_ah_from_wc(struct ibv_context *context, uint8_t port_num,
				   struct ibv_wc *wc, struct ibv_grh *grh,
				   struct ibv_ah_attr *ah_attr)
{
	struct ibv_port_attr port;

	if (!context || !wc || !ah_attr || !(wc->wc_flags & IBV_WC_GRH) || !grh ||
	    ibv_query_port(context, port_num, (struct _compat_ibv_port_attr *)&port)) {
		errno = EINVAL;
		return -1;
	}
	memset(ah_attr, 0, sizeof(*ah_attr));
	ah_attr->dlid = wc->slid;
	ah_attr->sl = wc->sl;
	ah_attr->port_num = port_num;
	ah_attr->is_global = 1;
	ah_attr->grh.dgid = grh->sgid;
	ah_attr->grh.hop_limit = 0xff;
	/* the source GID index: where our GID (the packet's dgid) sits in the
	 * port's table, through the library's own ibv_query_gid */
	for (int i = 0; i < port.gid_tbl_len && i <= UINT8_MAX; i++) {
		union ibv_gid g;

		if (ibv_query_gid(context, port_num, i, &g) == 0 &&
		    memcmp(&g, &grh->dgid, sizeof(g)) == 0) {
			ah_attr->grh.sgid_index = (uint8_t)i;
			return 0;
		}
	}
	errno = ENOENT;
	return -1;
}

ABI_EXPORT struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc,
					       struct ibv_grh *grh, uint8_t port_num)
{
	struct ibv_ah_attr attr;

	if (!pd || ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr))
		return NULL;
	return ibv_create_ah(pd, &attr);
}

/* ---- not supported ---- */

ABI_EXPORT int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid,
			       uint16_t lid)
{
	(void)qp; (void)gid; (void)lid;
	return EOPNOTSUPP;
}

ABI_EXPORT int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid,
			       uint16_t lid)
{
	(void)qp; (void)gid; (void)lid;
	return EOPNOTSUPP;
}

ABI_EXPORT int ibv_resolve_eth_l2_from_gid(struct ibv_context *context,
					  struct ibv_ah_attr *attr, uint8_t eth_mac[6],
					  uint16_t *vid)
{
	(void)context; (void)attr; (void)eth_mac; (void)vid;
	return EOPNOTSUPP;
}

/* ---- the device list's and P_Key table's calls: every device of the
 * project has one port (1) and one P_Key (the default, 0xffff, at index 0) ---- */

ABI_EXPORT void ibv_free_device_list(struct ibv_device **list)
{
	free(list);
}

ABI_EXPORT const char *ibv_get_device_name(struct ibv_device *device)
{
	return device ? device->name : NULL;
}

ABI_EXPORT int ibv_query_pkey(struct ibv_context *context, uint8_t port_num,
			      int index, __be16 *pkey)
{
	if (!context || !pkey || port_num != 1 || index != 0) {
		errno = EINVAL;
		return -1;
	}
	*pkey = htobe16(0xffff);
	return 0;
}

ABI_EXPORT int ibv_get_pkey_index(struct ibv_context *context, uint8_t port_num,
				  __be16 pkey)
{
	if (!context || port_num != 1 || (be16toh(pkey) & 0x7fff) != 0x7fff) {
		errno = EINVAL;
		return -1;
	}
	return 0;
}
