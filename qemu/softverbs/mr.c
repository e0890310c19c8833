/*
 * Protection domains, memory regions and address handles.
 *
 * An MR records the user address, the IOVA the SGEs will use (equal to the
 * address for ibv_reg_mr) and its length. Keys are unique in the process;
 * lkey == rkey. Registration checks that the whole range is mapped
 * (mincore), standing in for the pinning a real HCA does.
 */
#include "softverbs.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- PD ---- */

SV_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
	struct sv_context *ctx;
	struct sv_pd *pd;

	if (!context) {
		errno = EINVAL;
		return NULL;
	}
	ctx = to_ctx(context);
	sv_lock();
	if (ctx->n_pd >= SV_MAX_PD) {
		sv_unlock();
		errno = ENOMEM;
		return NULL;
	}
	pd = calloc(1, sizeof(*pd));
	if (!pd) {
		sv_unlock();
		errno = ENOMEM;
		return NULL;
	}
	pd->ibv.context = context;
	pd->ibv.handle = sv.next_key++;
	sv_list_add_tail(&ctx->pds, &pd->link);
	ctx->n_pd++;
	sv_unlock();
	return &pd->ibv;
}

void sv_pd_free(struct sv_pd *pd)
{
	to_ctx(pd->ibv.context)->n_pd--;
	sv_list_del(&pd->link);
	free(pd);
}

SV_EXPORT int ibv_dealloc_pd(struct ibv_pd *ibpd)
{
	struct sv_pd *pd;

	if (!ibpd)
		return EINVAL;
	pd = to_pd(ibpd);
	sv_lock();
	if (pd->refs) {
		sv_unlock();
		return EBUSY;
	}
	sv_pd_free(pd);
	sv_unlock();
	return 0;
}

/* ---- MR ---- */

static unsigned sv_key_hash(uint32_t key) { return (key ^ (key >> 8)) % SV_HASH; }

struct sv_mr *sv_mr_find(uint32_t lkey)
{
	struct sv_list *p;

	sv_list_each(p, &sv.mr_hash[sv_key_hash(lkey)]) {
		struct sv_mr *mr = sv_container_of(p, struct sv_mr, hlink);

		if (mr->ibv.lkey == lkey)
			return mr;
	}
	return NULL;
}

/* Checks that [addr, addr+length) is mapped in this process. */
static int sv_range_mapped(void *addr, size_t length)
{
	long pg = sysconf(_SC_PAGESIZE);
	uintptr_t start = (uintptr_t)addr & ~(uintptr_t)(pg - 1);
	uintptr_t end = ((uintptr_t)addr + length + pg - 1) & ~(uintptr_t)(pg - 1);
	size_t pages = (end - start) / pg;
	unsigned char *vec;
	int ok;

	if ((uintptr_t)addr + length < (uintptr_t)addr)
		return 0;
	vec = malloc(pages ? pages : 1);
	if (!vec)
		return 0;
	ok = mincore((void *)start, end - start, vec) == 0;
	free(vec);
	return ok;
}

static struct ibv_mr *sv_reg(struct ibv_pd *ibpd, void *addr, size_t length,
			     uint64_t iova, unsigned int access)
{
	const unsigned known = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			       IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
			       IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED;
	struct sv_context *ctx;
	struct sv_mr *mr;

	if (!ibpd) {
		errno = EINVAL;
		return NULL;
	}
	ctx = to_ctx(ibpd->context);
	if (access & IBV_ACCESS_ON_DEMAND) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	/* bits in the optional range are hints and may be ignored */
	access &= known | IBV_ACCESS_OPTIONAL_RANGE;
	if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
	    !(access & IBV_ACCESS_LOCAL_WRITE)) {
		errno = EINVAL;
		return NULL;
	}
	if (length == 0 || length > SV_MAX_MR_SIZE || !addr) {
		errno = EINVAL;
		return NULL;
	}
	if (access & IBV_ACCESS_ZERO_BASED)
		iova = 0;
	if (iova + length < iova) {
		errno = EINVAL;
		return NULL;
	}
	if (!sv_range_mapped(addr, length)) {
		errno = EFAULT;
		return NULL;
	}
	sv_lock();
	if (ctx->n_mr >= SV_MAX_MR) {
		sv_unlock();
		errno = ENOMEM;
		return NULL;
	}
	mr = calloc(1, sizeof(*mr));
	if (!mr) {
		sv_unlock();
		errno = ENOMEM;
		return NULL;
	}
	/* Keys: a running counter in the upper 24 bits and a fixed low byte,
	 * so a stale key of a freed MR does not name a new one soon. */
	do {
		sv.next_key++;
		mr->ibv.lkey = (sv.next_key << 8) | 0x5a;
	} while (mr->ibv.lkey == 0 || sv_mr_find(mr->ibv.lkey));
	mr->ibv.rkey = mr->ibv.lkey;
	mr->ibv.context = ibpd->context;
	mr->ibv.pd = ibpd;
	mr->ibv.addr = addr;
	mr->ibv.length = length;
	mr->ibv.handle = mr->ibv.lkey;
	mr->iova = iova;
	mr->access = (int)access;
	sv_list_add_tail(&ctx->mrs, &mr->link);
	sv_list_add_tail(&sv.mr_hash[sv_key_hash(mr->ibv.lkey)], &mr->hlink);
	to_pd(ibpd)->refs++;
	ctx->n_mr++;
	sv_unlock();
	return &mr->ibv;
}

SV_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length,
				    int access)
{
	return sv_reg(pd, addr, length, (uintptr_t)addr, (unsigned)access);
}

SV_EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr,
					 size_t length, uint64_t iova, int access)
{
	return sv_reg(pd, addr, length, iova, (unsigned)access);
}

SV_EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr,
					  size_t length, uint64_t iova,
					  unsigned int access)
{
	return sv_reg(pd, addr, length, iova, access);
}

SV_EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset,
					   size_t length, uint64_t iova, int fd,
					   int access)
{
	(void)pd; (void)offset; (void)length; (void)iova; (void)fd; (void)access;
	errno = EOPNOTSUPP;
	return NULL;
}

void sv_mr_free(struct sv_mr *mr)
{
	to_ctx(mr->ibv.context)->n_mr--;
	to_pd(mr->ibv.pd)->refs--;
	sv_list_del(&mr->link);
	sv_list_del(&mr->hlink);
	free(mr);
}

SV_EXPORT int ibv_dereg_mr(struct ibv_mr *mr)
{
	if (!mr)
		return EINVAL;
	sv_lock();
	sv_mr_free(to_mr(mr));
	sv_unlock();
	return 0;
}

SV_EXPORT int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd,
			   void *addr, size_t length, int access)
{
	(void)mr; (void)flags; (void)pd; (void)addr; (void)length; (void)access;
	errno = EOPNOTSUPP;
	return IBV_REREG_MR_ERR_INPUT;
}

/*
 * Translates one SGE of a work request on a QP/SRQ of 'pd' to a host
 * pointer. Fails (NULL, *st = IBV_WC_LOC_PROT_ERR) on an unknown key, an
 * MR of another PD, a range outside the MR, or a missing LOCAL_WRITE
 * right when the access writes. Called locked.
 */
void *sv_mr_check(struct ibv_pd *pd, const struct ibv_sge *sge, int need_write,
		  enum ibv_wc_status *st)
{
	struct sv_mr *mr = sv_mr_find(sge->lkey);
	uint64_t off;

	*st = IBV_WC_LOC_PROT_ERR;
	if (!mr || mr->ibv.pd != pd)
		return NULL;
	if (need_write && !(mr->access & IBV_ACCESS_LOCAL_WRITE))
		return NULL;
	if (sge->addr < mr->iova)
		return NULL;
	off = sge->addr - mr->iova;
	if (off > mr->ibv.length || sge->length > mr->ibv.length - off)
		return NULL;
	*st = IBV_WC_SUCCESS;
	return (char *)mr->ibv.addr + off;
}

/* ---- AH ---- */

SV_EXPORT struct ibv_ah *ibv_create_ah(struct ibv_pd *ibpd, struct ibv_ah_attr *attr)
{
	struct sv_context *ctx;
	union ibv_gid sgid;
	struct sv_ah *ah;

	if (!ibpd || !attr) {
		errno = EINVAL;
		return NULL;
	}
	ctx = to_ctx(ibpd->context);
	/* Ethernet link layer: only global (GRH) addresses route. */
	if (!attr->is_global || (attr->port_num && attr->port_num != SV_PORT)) {
		errno = EINVAL;
		return NULL;
	}
	sv_lock();
	if (sv_query_gid_locked(attr->grh.sgid_index, &sgid) || sv_gid_is_zero(&sgid)) {
		sv_unlock();
		errno = EINVAL;
		return NULL;
	}
	if (ctx->n_ah >= SV_MAX_AH) {
		sv_unlock();
		errno = ENOMEM;
		return NULL;
	}
	ah = calloc(1, sizeof(*ah));
	if (!ah) {
		sv_unlock();
		errno = ENOMEM;
		return NULL;
	}
	ah->ibv.context = ibpd->context;
	ah->ibv.pd = ibpd;
	ah->ibv.handle = sv.next_key++;
	ah->dgid = attr->grh.dgid;
	ah->sgid = sgid;
	sv_list_add_tail(&ctx->ahs, &ah->link);
	to_pd(ibpd)->refs++;
	ctx->n_ah++;
	sv_unlock();
	return &ah->ibv;
}

void sv_ah_free(struct sv_ah *ah)
{
	to_ctx(ah->ibv.context)->n_ah--;
	to_pd(ah->ibv.pd)->refs--;
	sv_list_del(&ah->link);
	free(ah);
}

SV_EXPORT int ibv_destroy_ah(struct ibv_ah *ah)
{
	if (!ah)
		return EINVAL;
	sv_lock();
	sv_ah_free(to_ah(ah));
	sv_unlock();
	return 0;
}
