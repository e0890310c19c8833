/*
 * The drop-in's C structures: each verbs object opens with the struct
 * libibverbs defines and holds the id of the Go object behind it
 * (package bridge's tables). The Go side (glue.go) reads the work
 * requests and writes the completions through the mirrors below, whose
 * layouts are pinned to <infiniband/verbs.h>'s.
 */
#ifndef VFRDMA_DROPIN_H
#define VFRDMA_DROPIN_H

#include "../verbsabi/abi.h"

#include <stddef.h>
#include <stdint.h>

#define VF_MAX_DEVICES 32

/* Where rdma-core puts a struct verbs_device: the generic part, then the
 * owning provider's ops (NULL: no rdma-core provider owns the device). */
struct vf_device {
	struct ibv_device ibv;
	const void *ops;
	void *reserved[6];
	int index;
};

/* What VFRDMA_CALLS=1 counts per context, told on stderr at close: the
 * data path's calls, each one crossing into Go. */
struct vf_calls {
	unsigned long post_send, send_wrs, post_recv, recv_wrs, poll, empty_polls, completions, arms;
};

struct vf_context {
	struct verbs_context v; /* ends with struct ibv_context */
	uint32_t id;
	struct vf_calls *calls; /* NULL unless VFRDMA_CALLS=1 */
};

struct vf_pd { struct ibv_pd ibv; uint32_t id; };
struct vf_mr { struct ibv_mr ibv; uint32_t id; };
struct vf_cq { struct ibv_cq ibv; uint32_t id; };
struct vf_channel { struct ibv_comp_channel ibv; uint32_t id; };
struct vf_qp { struct ibv_qp ibv; uint32_t id; };
struct vf_srq { struct ibv_srq ibv; uint32_t id; };
struct vf_ah { struct ibv_ah ibv; uint32_t id; };

/* struct ibv_send_wr with its unions as plain words: w0..w3 are wr.rdma
 * (remote_addr, rkey), wr.atomic (remote_addr, compare_add, swap, rkey)
 * or wr.ud (ah, remote_qpn | remote_qkey << 32). */
struct vf_send_wr {
	uint64_t wr_id;
	struct vf_send_wr *next;
	struct ibv_sge *sg_list;
	int num_sge;
	uint32_t opcode;
	uint32_t send_flags;
	uint32_t imm_data;
	uint64_t w0, w1, w2;
	uint32_t w3;
};
_Static_assert(offsetof(struct vf_send_wr, imm_data) == offsetof(struct ibv_send_wr, imm_data), "imm_data");
_Static_assert(offsetof(struct vf_send_wr, w0) == offsetof(struct ibv_send_wr, wr.rdma.remote_addr), "wr");
_Static_assert(offsetof(struct vf_send_wr, w1) == offsetof(struct ibv_send_wr, wr.atomic.compare_add), "compare_add");
_Static_assert(offsetof(struct vf_send_wr, w1) == offsetof(struct ibv_send_wr, wr.rdma.rkey), "rkey");
_Static_assert(offsetof(struct vf_send_wr, w1) == offsetof(struct ibv_send_wr, wr.ud.remote_qpn), "remote_qpn");
_Static_assert(offsetof(struct vf_send_wr, w2) == offsetof(struct ibv_send_wr, wr.atomic.swap), "swap");
_Static_assert(offsetof(struct vf_send_wr, w3) == offsetof(struct ibv_send_wr, wr.atomic.rkey), "atomic rkey");

/* struct ibv_wc without its union. */
struct vf_wc {
	uint64_t wr_id;
	uint32_t status, opcode, vendor_err, byte_len, imm_data, qp_num, src_qp, wc_flags;
	uint16_t pkey_index, slid;
	uint8_t sl, dlid_path_bits;
};
_Static_assert(sizeof(struct vf_wc) == sizeof(struct ibv_wc), "ibv_wc");
_Static_assert(offsetof(struct vf_wc, imm_data) == offsetof(struct ibv_wc, imm_data), "wc imm_data");
_Static_assert(offsetof(struct vf_wc, wc_flags) == offsetof(struct ibv_wc, wc_flags), "wc_flags");

/* struct ibv_sge is the driver's SGE (Addr, Length, LKey). */
_Static_assert(sizeof(struct ibv_sge) == 16, "ibv_sge");

#endif
