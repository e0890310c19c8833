/*
 * libibverbs' private provider interface (version node IBVERBS_PRIVATE_34).
 *
 * rdma-core's provider libraries (libmlx5.so.1, libefa.so.1, libmlx4.so.1,
 * libmana.so.1) import these symbols, and programs such as perftest link
 * those libraries directly, so the dynamic linker needs every one of them
 * before main() runs. A provider drives a kernel uverbs device through
 * them; the libraries of this project have none, and their devices belong
 * to no provider:
 *
 *  - verbs_register_driver_34 accepts the registration a provider makes
 *    from its constructor and ignores it (there is no device to bind);
 *  - the kernel-command helpers (execute_ioctl, ibv_cmd_*) fail with
 *    EOPNOTSUPP, returned and in errno, as their callers expect of a
 *    failed command (ibv_cmd_poll_cq: -1). No provider context can exist,
 *    so nothing valid can reach them;
 *  - the context helpers create nothing (_verbs_init_and_alloc_context
 *    returns NULL) and verbs_open_device opens the device like
 *    ibv_open_device when given no provider data;
 *  - __verbs_log prints nothing (the library never prints).
 *
 * Structures private to rdma-core (verbs_context, verbs_mr, verbs_qp, the
 * command buffers, ...) appear here as void pointers: nothing looks inside
 * them except __ioctl_final_num_attrs, which walks the command-buffer
 * chain the caller built (struct abi_cmdbuf mirrors its layout).
 */
#include "abi.h"

#include <errno.h>
#include <rdma/rdma_user_ioctl_cmds.h>
#include <stdarg.h>
#include <stdbool.h>

/* Most calls below fail before looking at their parameters. */
#pragma GCC diagnostic ignored "-Wunused-parameter"

/* rdma-core's bool that lets destroy calls succeed on a disassociated
 * device; exported as data. Nothing here reads it. */
ABI_EXPORT bool verbs_allow_disassociate_destroy;

static int abi_no_kernel(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

/* ---- provider registration and contexts ---- */

ABI_EXPORT void verbs_register_driver_34(const void *ops)
{
	/* No kernel device exists for a hardware provider to bind to. */
}

ABI_EXPORT void __verbs_log(void *ctx, uint32_t level, const char *fmt, ...)
{
}

ABI_EXPORT void *_verbs_init_and_alloc_context(struct ibv_device *device,
					      int cmd_fd, size_t alloc_size,
					      void *context_offset,
					      uint32_t driver_id)
{
	errno = EOPNOTSUPP;
	return NULL;
}

ABI_EXPORT void verbs_uninit_context(void *vctx)
{
	/* only contexts made by _verbs_init_and_alloc_context need this */
}

ABI_EXPORT void verbs_set_ops(void *vctx, const void *ops)
{
	/* only provider contexts carry an ops table of this kind */
}

/* Fills the generic part of a CQ a provider allocated. */
ABI_EXPORT void verbs_init_cq(struct ibv_cq *cq, struct ibv_context *context,
			     struct ibv_comp_channel *channel, void *cq_context)
{
	if (!cq)
		return;
	cq->context = context;
	cq->channel = channel;
	cq->cq_context = cq_context;
	cq->comp_events_completed = 0;
	cq->async_events_completed = 0;
	pthread_mutex_init(&cq->mutex, NULL);
	pthread_cond_init(&cq->cond, NULL);
}

/* ibv_open_device plus provider-specific data (e.g. mlx5dv_context_attr);
 * the devices of this project take none. */
ABI_EXPORT struct ibv_context *verbs_open_device(struct ibv_device *device,
						void *private_data)
{
	if (private_data) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	return ibv_open_device(device);
}

/* A sysfs attribute of a provider's device; no such device exists. */
ABI_EXPORT int ibv_read_ibdev_sysfs_file(char *buf, size_t size, void *sysfs_dev,
					const char *fnfmt, ...)
{
	errno = EOPNOTSUPP;
	return -1;
}

/* ---- kernel ioctl command buffers ---- */

/* rdma-core's struct ibv_command_buffer: a chain of attribute blocks. */
struct abi_cmdbuf {
	struct abi_cmdbuf *next;
	struct ib_uverbs_attr *next_attr;
	struct ib_uverbs_attr *last_attr;
	uint8_t uhw_in_idx, uhw_out_idx;
	uint8_t uhw_in_headroom_dwords, uhw_out_headroom_dwords;
	uint8_t flags;
	struct ib_uverbs_ioctl_hdr hdr;
};

/* The attribute count of a command after linking in the chained blocks:
 * num_attrs plus the attributes filled in each block of the chain. */
ABI_EXPORT unsigned int __ioctl_final_num_attrs(unsigned int num_attrs,
					       struct abi_cmdbuf *link)
{
	for (; link; link = link->next)
		num_attrs += (unsigned int)(link->next_attr - link->hdr.attrs);
	return num_attrs;
}

ABI_EXPORT int execute_ioctl(struct ibv_context *context, void *cmd)
{
	return abi_no_kernel();
}

/* ---- kernel uverbs commands: all fail, there is no uverbs device ---- */

ABI_EXPORT int ibv_cmd_get_context(void *vctx, void *cmd, size_t cmd_size,
				  void *resp, size_t resp_size)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_query_context(struct ibv_context *ctx, void *driver)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_query_device_any(struct ibv_context *context,
				       const struct ibv_query_device_ex_input *input,
				       struct ibv_device_attr_ex *attr,
				       size_t attr_size, void *resp,
				       size_t *resp_size)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_query_port(struct ibv_context *context, uint8_t port_num,
				 struct ibv_port_attr *port_attr, void *cmd,
				 size_t cmd_size)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_alloc_pd(struct ibv_context *context, struct ibv_pd *pd,
			       void *cmd, size_t cmd_size, void *resp,
			       size_t resp_size)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_dealloc_pd(struct ibv_pd *pd)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_open_xrcd(struct ibv_context *context, void *xrcd,
				int vxrcd_size, struct ibv_xrcd_init_attr *attr,
				void *cmd, size_t cmd_size, void *resp,
				size_t resp_size)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_close_xrcd(void *xrcd)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_reg_mr(struct ibv_pd *pd, void *addr, size_t length,
			     uint64_t hca_va, int access, void *vmr, void *cmd,
			     size_t cmd_size, void *resp, size_t resp_size)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_rereg_mr(void *vmr, uint32_t flags, void *addr,
			       size_t length, uint64_t hca_va, int access,
			       struct ibv_pd *pd, void *cmd, size_t cmd_sz,
			       void *resp, size_t resp_sz)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_dereg_mr(void *vmr)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_query_mr(struct ibv_pd *pd, void *vmr, uint32_t mr_handle)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_advise_mr(struct ibv_pd *pd,
				enum ibv_advise_mr_advice advice, uint32_t flags,
				struct ibv_sge *sg_list, uint32_t num_sge)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset,
				    size_t length, uint64_t iova, int fd,
				    int access, void *vmr)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type,
			       struct ibv_mw *mw, void *cmd, size_t cmd_size,
			       void *resp, size_t resp_size)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_dealloc_mw(struct ibv_mw *mw)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_create_cq(struct ibv_context *context, int cqe,
				struct ibv_comp_channel *channel, int comp_vector,
				struct ibv_cq *cq, void *cmd, size_t cmd_size,
				void *resp, size_t resp_size)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_create_cq_ex(struct ibv_context *context,
				   const struct ibv_cq_init_attr_ex *cq_attr,
				   void *cq, void *cmd, size_t cmd_size,
				   void *resp, size_t resp_size,
				   uint32_t cmd_flags)
{
	return abi_no_kernel();
}

/* Returns a completion count, so failure is -1. */
ABI_EXPORT int ibv_cmd_poll_cq(struct ibv_cq *cq, int ne, struct ibv_wc *wc)
{
	errno = EOPNOTSUPP;
	return -1;
}

ABI_EXPORT int ibv_cmd_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_resize_cq(struct ibv_cq *cq, int cqe, void *cmd,
				size_t cmd_size, void *resp, size_t resp_size)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_destroy_cq(struct ibv_cq *cq)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_modify_cq(struct ibv_cq *cq,
				struct ibv_modify_cq_attr *attr, void *cmd,
				size_t cmd_size)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_create_srq(struct ibv_pd *pd, struct ibv_srq *srq,
				 struct ibv_srq_init_attr *attr, void *cmd,
				 size_t cmd_size, void *resp, size_t resp_size)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_create_srq_ex(struct ibv_context *context, void *srq,
				    struct ibv_srq_init_attr_ex *attr_ex,
				    void *cmd, size_t cmd_size, void *resp,
				    size_t resp_size)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_modify_srq(struct ibv_srq *srq,
				 struct ibv_srq_attr *srq_attr, int srq_attr_mask,
				 void *cmd, size_t cmd_size)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_query_srq(struct ibv_srq *srq,
				struct ibv_srq_attr *srq_attr, void *cmd,
				size_t cmd_size)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_destroy_srq(struct ibv_srq *srq)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_create_qp(struct ibv_pd *pd, struct ibv_qp *qp,
				struct ibv_qp_init_attr *attr, void *cmd,
				size_t cmd_size, void *resp, size_t resp_size)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_create_qp_ex(struct ibv_context *context, void *qp,
				   struct ibv_qp_init_attr_ex *attr_ex,
				   void *cmd, size_t cmd_size, void *resp,
				   size_t resp_size)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_create_qp_ex2(struct ibv_context *context, void *qp,
				    struct ibv_qp_init_attr_ex *qp_attr,
				    void *cmd, size_t cmd_size, void *resp,
				    size_t resp_size)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_open_qp(struct ibv_context *context, void *qp,
			      int vqp_sz, struct ibv_qp_open_attr *attr,
			      void *cmd, size_t cmd_size, void *resp,
			      size_t resp_size)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *qp_attr,
			       int attr_mask,
			       struct ibv_qp_init_attr *qp_init_attr,
			       void *cmd, size_t cmd_size)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr,
				int attr_mask, void *cmd, size_t cmd_size)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_modify_qp_ex(struct ibv_qp *qp, struct ibv_qp_attr *attr,
				   int attr_mask, void *cmd, size_t cmd_size,
				   void *resp, size_t resp_size)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_destroy_qp(struct ibv_qp *qp)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr,
				struct ibv_send_wr **bad_wr)
{
	if (bad_wr)
		*bad_wr = wr;
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr,
				struct ibv_recv_wr **bad_wr)
{
	if (bad_wr)
		*bad_wr = wr;
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr,
				    struct ibv_recv_wr **bad_wr)
{
	if (bad_wr)
		*bad_wr = wr;
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_create_ah(struct ibv_pd *pd, struct ibv_ah *ah,
				struct ibv_ah_attr *attr, void *resp,
				size_t resp_size)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_destroy_ah(struct ibv_ah *ah)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid,
				   uint16_t lid)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid,
				   uint16_t lid)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_create_flow(struct ibv_qp *qp, struct ibv_flow *flow_id,
				  struct ibv_flow_attr *flow_attr, void *ucmd,
				  size_t ucmd_size)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_destroy_flow(struct ibv_flow *flow_id)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_create_flow_action_esp(struct ibv_context *ctx,
					     struct ibv_flow_action_esp_attr *attr,
					     void *flow_action, void *driver)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_modify_flow_action_esp(void *flow_action,
					     struct ibv_flow_action_esp_attr *attr,
					     void *driver)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_destroy_flow_action(void *action)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_create_wq(struct ibv_context *context,
				struct ibv_wq_init_attr *wq_init_attr,
				struct ibv_wq *wq, void *cmd, size_t cmd_size,
				void *resp, size_t resp_size)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_modify_wq(struct ibv_wq *wq, struct ibv_wq_attr *attr,
				void *cmd, size_t cmd_size)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_destroy_wq(struct ibv_wq *wq)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_create_rwq_ind_table(struct ibv_context *context,
					   struct ibv_rwq_ind_table_init_attr *init_attr,
					   struct ibv_rwq_ind_table *rwq_ind_table,
					   void *resp, size_t resp_size)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_destroy_rwq_ind_table(struct ibv_rwq_ind_table *rwq_ind_table)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_create_counters(struct ibv_context *context,
				      struct ibv_counters_init_attr *init_attr,
				      void *vcounters, void *link)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_destroy_counters(void *vcounters)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_read_counters(void *vcounters, uint64_t *counters_value,
				    uint32_t ncounters, uint32_t flags,
				    void *link)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_alloc_dm(struct ibv_context *ctx,
			       const struct ibv_alloc_dm_attr *dm_attr, void *dm,
			       void *link)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_free_dm(void *dm)
{
	return abi_no_kernel();
}

ABI_EXPORT int ibv_cmd_reg_dm_mr(struct ibv_pd *pd, void *dm, uint64_t offset,
				size_t length, unsigned int access, void *vmr,
				void *link)
{
	return abi_no_kernel();
}
