package main

/*
#cgo CFLAGS: -O2 -std=gnu11 -Wall -fvisibility=hidden
#include "dropin.h"
#include <string.h>
*/
import "C"

import (
	"errors"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/ibverbs/internal/bridge"
)

func main() {}

var (
	envOnce sync.Once
	env     bridge.Env
	listMu  sync.Mutex
	listed  []bridge.DeviceInfo
)

func getEnv() bridge.Env {
	envOnce.Do(func() { env = bridge.EnvFrom(os.Getenv) })
	return env
}

// neg returns -errno for err (a C return value).
func neg(err error) C.int {
	e := bridge.Errno(err)
	if e == 0 {
		e = syscall.EIO
	}
	if getEnv().Debug {
		getEnv().Logf(os.Stderr, "%v (errno %d)", err, int(e))
	}
	return -C.int(e)
}

func cstr(dst []C.char, s string) {
	n := min(len(s), len(dst)-1)
	for i := range n {
		dst[i] = C.char(s[i])
	}
	dst[n] = 0
}

//export vfgoDeviceList
func vfgoDeviceList(out *C.struct_vf_device, max C.int) C.int {
	devs, err := bridge.Devices(getEnv())
	if err != nil {
		return neg(err)
	}
	listMu.Lock()
	listed = devs
	listMu.Unlock()
	ds := unsafe.Slice(out, int(max))
	n := min(len(devs), int(max))
	for i := range n {
		d := &ds[i]
		d.ibv.node_type = C.IBV_NODE_CA
		d.ibv.transport_type = C.IBV_TRANSPORT_IB
		cstr(d.ibv.name[:], devs[i].Name)
		cstr(d.ibv.dev_name[:], "uverbs"+devs[i].Name[len("vfrdma"):])
		cstr(d.ibv.dev_path[:], "/sys/class/infiniband_verbs/uverbs"+devs[i].Name[len("vfrdma"):])
		cstr(d.ibv.ibdev_path[:], "/sys/class/infiniband/"+devs[i].Name)
		d.index = C.int(i)
	}
	return C.int(n)
}

//export vfgoOpen
func vfgoOpen(index C.int) C.int {
	listMu.Lock()
	var info bridge.DeviceInfo
	ok := int(index) < len(listed)
	if ok {
		info = listed[index]
	}
	listMu.Unlock()
	if !ok {
		return -C.int(syscall.ENODEV)
	}
	c, err := bridge.Open(info, getEnv())
	if err != nil {
		return neg(err)
	}
	return C.int(c.ID)
}

//export vfgoClose
func vfgoClose(id C.uint32_t) C.int {
	c := bridge.ContextByID(uint32(id))
	if c == nil {
		return -C.int(syscall.EINVAL)
	}
	if err := c.Close(); err != nil {
		return neg(err)
	}
	return 0
}

//export vfgoAsyncFD
func vfgoAsyncFD(id C.uint32_t) C.int {
	c := bridge.ContextByID(uint32(id))
	if c == nil {
		return -C.int(syscall.EINVAL)
	}
	return C.int(c.AsyncFD())
}

//export vfgoQueryDevice
func vfgoQueryDevice(id C.uint32_t, a *C.struct_ibv_device_attr) C.int {
	c := bridge.ContextByID(uint32(id))
	if c == nil {
		return -C.int(syscall.EINVAL)
	}
	d := c.DeviceAttr()
	C.memset(unsafe.Pointer(a), 0, C.sizeof_struct_ibv_device_attr)
	cstr(a.fw_ver[:], d.FWVer)
	a.node_guid = C.__be64(be64(d.NodeGUID))
	a.sys_image_guid = C.__be64(be64(d.SysImageGUID))
	a.max_mr_size = C.uint64_t(d.MaxMRSize)
	a.page_size_cap = C.uint64_t(d.PageSizeCap)
	a.vendor_id = C.uint32_t(d.VendorID)
	a.vendor_part_id = C.uint32_t(d.VendorPartID)
	a.hw_ver = C.uint32_t(d.HWVer)
	a.max_qp = C.int(d.MaxQP)
	a.max_qp_wr = C.int(d.MaxQPWR)
	a.device_cap_flags = C.uint(d.DeviceCapFlags)
	a.max_sge = C.int(d.MaxSGE)
	a.max_sge_rd = C.int(d.MaxSGERD)
	a.max_cq = C.int(d.MaxCQ)
	a.max_cqe = C.int(d.MaxCQE)
	a.max_mr = C.int(d.MaxMR)
	a.max_pd = C.int(d.MaxPD)
	a.max_qp_rd_atom = C.int(d.MaxQPRDAtom)
	a.max_qp_init_rd_atom = C.int(d.MaxQPInitRD)
	a.max_res_rd_atom = C.int(d.MaxResRDAtom)
	a.atomic_cap = uint32(d.AtomicCap)
	a.max_ah = C.int(d.MaxAH)
	a.max_srq = C.int(d.MaxSRQ)
	a.max_srq_wr = C.int(d.MaxSRQWR)
	a.max_srq_sge = C.int(d.MaxSRQSGE)
	a.max_pkeys = C.uint16_t(d.MaxPKeys)
	a.local_ca_ack_delay = C.uint8_t(d.LocalCAAckDelay)
	a.phys_port_cnt = C.uint8_t(d.PhysPortCnt)
	return 0
}

func be64(v uint64) uint64 {
	var b [8]byte
	for i := range 8 {
		b[i] = byte(v >> (56 - 8*i))
	}
	return *(*uint64)(unsafe.Pointer(&b))
}

// vfgoQueryPort fills the first n bytes of a struct ibv_port_attr.
//
//export vfgoQueryPort
func vfgoQueryPort(id C.uint32_t, port C.int, out unsafe.Pointer, n C.size_t) C.int {
	c := bridge.ContextByID(uint32(id))
	if c == nil {
		return -C.int(syscall.EINVAL)
	}
	p, err := c.QueryPort(int(port))
	if err != nil {
		return neg(err)
	}
	var a C.struct_ibv_port_attr
	a.state = uint32(p.State)
	a.max_mtu = uint32(p.MaxMTU)
	a.active_mtu = uint32(p.ActiveMTU)
	a.gid_tbl_len = C.int(p.GIDTblLen)
	a.port_cap_flags = C.uint32_t(p.PortCapFlags)
	a.max_msg_sz = C.uint32_t(p.MaxMsgSz)
	a.bad_pkey_cntr = C.uint32_t(p.BadPKeyCntr)
	a.qkey_viol_cntr = C.uint32_t(p.QKeyViolCntr)
	a.pkey_tbl_len = C.uint16_t(p.PKeyTblLen)
	a.lid = C.uint16_t(p.LID)
	a.sm_lid = C.uint16_t(p.SMLID)
	a.lmc = C.uint8_t(p.LMC)
	a.max_vl_num = C.uint8_t(p.MaxVLNum)
	a.sm_sl = C.uint8_t(p.SMSL)
	a.subnet_timeout = C.uint8_t(p.SubnetTimeout)
	a.init_type_reply = C.uint8_t(p.InitTypeReply)
	a.active_width = C.uint8_t(p.ActiveWidth)
	a.active_speed = C.uint8_t(p.ActiveSpeed)
	a.phys_state = C.uint8_t(p.PhysState)
	a.link_layer = C.uint8_t(p.LinkLayer)
	C.memcpy(out, unsafe.Pointer(&a), min(n, C.sizeof_struct_ibv_port_attr))
	return 0
}

//export vfgoQueryGID
func vfgoQueryGID(id C.uint32_t, port, index C.int, gid *C.union_ibv_gid) C.int {
	c := bridge.ContextByID(uint32(id))
	if c == nil {
		return -C.int(syscall.EINVAL)
	}
	g, err := c.GID(int(port), int(index))
	if err != nil {
		return neg(err)
	}
	*(*[16]byte)(unsafe.Pointer(gid)) = g
	return 0
}

// vfgoGIDInfo returns 1 for RoCE v2 GIDs, 0 for v1, with the table's length.
//
//export vfgoGIDInfo
func vfgoGIDInfo(id C.uint32_t, tblLen *C.int) C.int {
	c := bridge.ContextByID(uint32(id))
	if c == nil {
		return -C.int(syscall.EINVAL)
	}
	*tblLen = C.int(c.Dev.Caps().GIDTblLen)
	if c.RoCEv2() {
		return 1
	}
	return 0
}

//export vfgoAllocPD
func vfgoAllocPD(id C.uint32_t, handle *C.uint32_t) C.int {
	c := bridge.ContextByID(uint32(id))
	if c == nil {
		return -C.int(syscall.EINVAL)
	}
	pd, err := c.AllocPD()
	if err != nil {
		return neg(err)
	}
	*handle = C.uint32_t(pd.Handle())
	return C.int(pd.ID)
}

//export vfgoDeallocPD
func vfgoDeallocPD(id C.uint32_t) C.int {
	pd := bridge.PDByID(uint32(id))
	if pd == nil {
		return -C.int(syscall.EINVAL)
	}
	if err := pd.Dealloc(); err != nil {
		return neg(err)
	}
	return 0
}

//export vfgoRegMR
func vfgoRegMR(pdID C.uint32_t, addr unsafe.Pointer, length C.size_t, iova C.uint64_t, access C.int, mr *C.struct_ibv_mr) C.int {
	pd := bridge.PDByID(uint32(pdID))
	if pd == nil {
		return -C.int(syscall.EINVAL)
	}
	m, err := pd.RegMR(addr, int(length), uint64(iova), int(access))
	if err != nil {
		return neg(err)
	}
	mr.lkey = C.uint32_t(m.LKey())
	mr.rkey = C.uint32_t(m.RKey())
	mr.handle = C.uint32_t(m.Handle())
	return C.int(m.ID)
}

//export vfgoDeregMR
func vfgoDeregMR(id C.uint32_t) C.int {
	m := bridge.MRByID(uint32(id))
	if m == nil {
		return -C.int(syscall.EINVAL)
	}
	if err := m.Dereg(); err != nil {
		return neg(err)
	}
	return 0
}

//export vfgoCreateChannel
func vfgoCreateChannel(id C.uint32_t, fd *C.int) C.int {
	c := bridge.ContextByID(uint32(id))
	if c == nil {
		return -C.int(syscall.EINVAL)
	}
	ch, err := c.CreateChannel()
	if err != nil {
		return neg(err)
	}
	*fd = C.int(ch.FD)
	return C.int(ch.ID)
}

//export vfgoDestroyChannel
func vfgoDestroyChannel(id C.uint32_t) C.int {
	ch := bridge.ChannelByID(uint32(id))
	if ch == nil {
		return -C.int(syscall.EINVAL)
	}
	if err := ch.Destroy(); err != nil {
		return neg(err)
	}
	return 0
}

// vfgoGetCQEvent returns the C structure of the CQ that fired.
//
//export vfgoGetCQEvent
func vfgoGetCQEvent(id C.uint32_t, cqOut *unsafe.Pointer) C.int {
	ch := bridge.ChannelByID(uint32(id))
	if ch == nil {
		return -C.int(syscall.EINVAL)
	}
	cq, err := ch.GetEvent()
	if err != nil {
		return neg(err)
	}
	*cqOut = cq.User
	return 0
}

//export vfgoAckCQEvents
func vfgoAckCQEvents(id C.uint32_t, n C.uint) {
	if cq := bridge.CQByID(uint32(id)); cq != nil {
		cq.AckEvents(uint32(n))
	}
}

//export vfgoCreateCQ
func vfgoCreateCQ(ctxID C.uint32_t, cqe C.int, chID C.uint32_t, user *C.struct_vf_cq) C.int {
	c := bridge.ContextByID(uint32(ctxID))
	if c == nil {
		return -C.int(syscall.EINVAL)
	}
	var ch *bridge.Channel
	if chID != 0 {
		if ch = bridge.ChannelByID(uint32(chID)); ch == nil {
			return -C.int(syscall.EINVAL)
		}
	}
	cq, err := c.CreateCQ(int(cqe), ch)
	if err != nil {
		return neg(err)
	}
	cq.User = unsafe.Pointer(user)
	user.ibv.cqe = C.int(cq.Entries())
	user.ibv.handle = C.uint32_t(cq.Handle())
	return C.int(cq.ID)
}

//export vfgoDestroyCQ
func vfgoDestroyCQ(id C.uint32_t) C.int {
	cq := bridge.CQByID(uint32(id))
	if cq == nil {
		return -C.int(syscall.EINVAL)
	}
	if err := cq.Destroy(); err != nil {
		return neg(err)
	}
	return 0
}

// vfgoPollCQ is ops.poll_cq: one crossing for the whole array.
//
//export vfgoPollCQ
func vfgoPollCQ(id C.uint32_t, ne C.int, wc *C.struct_vf_wc) C.int {
	cq := bridge.CQByID(uint32(id))
	if cq == nil || ne < 0 {
		return -1
	}
	out := unsafe.Slice(wc, int(ne))
	total := 0
	for total < len(out) {
		got, err := cq.Poll(len(out) - total)
		for i := range got {
			g, o := &got[i], &out[total+i]
			o.wr_id = C.uint64_t(g.WRID)
			o.status = C.uint32_t(g.Status)
			o.opcode = C.uint32_t(g.Opcode)
			o.vendor_err = C.uint32_t(g.VendorErr)
			o.byte_len = C.uint32_t(g.ByteLen)
			o.imm_data = C.uint32_t(g.ImmBE)
			o.qp_num = C.uint32_t(g.QPN)
			o.src_qp = C.uint32_t(g.SrcQP)
			o.wc_flags = C.uint32_t(g.Flags)
			o.pkey_index, o.slid, o.sl, o.dlid_path_bits = 0, 0, 0, 0
		}
		total += len(got)
		cq.EndPoll()
		if err != nil {
			if total > 0 {
				return C.int(total)
			}
			return -1
		}
		if len(got) < cq.Capacity() {
			break
		}
	}
	return C.int(total)
}

//export vfgoReqNotify
func vfgoReqNotify(id C.uint32_t, solicited C.int) C.int {
	cq := bridge.CQByID(uint32(id))
	if cq == nil {
		return C.int(syscall.EINVAL)
	}
	if err := cq.ReqNotify(solicited != 0); err != nil {
		return -neg(err)
	}
	return 0
}

//export vfgoCreateQP
func vfgoCreateQP(pdID C.uint32_t, a *C.struct_ibv_qp_init_attr, user *C.struct_vf_qp) C.int {
	pd := bridge.PDByID(uint32(pdID))
	if pd == nil {
		return -C.int(syscall.EINVAL)
	}
	in := bridge.QPInit{Type: int(a.qp_type), SignalAll: a.sq_sig_all != 0,
		Cap: bridge.QPCap{MaxSendWR: int(a.cap.max_send_wr), MaxRecvWR: int(a.cap.max_recv_wr),
			MaxSendSGE: int(a.cap.max_send_sge), MaxRecvSGE: int(a.cap.max_recv_sge), MaxInlineData: int(a.cap.max_inline_data)}}
	if a.send_cq != nil {
		in.SendCQ = bridge.CQByID(uint32((*C.struct_vf_cq)(unsafe.Pointer(a.send_cq)).id))
	}
	if a.recv_cq != nil {
		in.RecvCQ = bridge.CQByID(uint32((*C.struct_vf_cq)(unsafe.Pointer(a.recv_cq)).id))
	}
	if a.srq != nil {
		if in.SRQ = bridge.SRQByID(uint32((*C.struct_vf_srq)(unsafe.Pointer(a.srq)).id)); in.SRQ == nil {
			return -C.int(syscall.EINVAL)
		}
	}
	qp, err := pd.CreateQP(in)
	if err != nil {
		return neg(err)
	}
	qp.User = unsafe.Pointer(user)
	c := qp.Cap()
	a.cap.max_send_wr = C.uint32_t(c.MaxSendWR)
	a.cap.max_recv_wr = C.uint32_t(c.MaxRecvWR)
	a.cap.max_send_sge = C.uint32_t(c.MaxSendSGE)
	a.cap.max_recv_sge = C.uint32_t(c.MaxRecvSGE)
	a.cap.max_inline_data = C.uint32_t(c.MaxInlineData)
	user.ibv.qp_num = C.uint32_t(qp.QPN())
	user.ibv.handle = C.uint32_t(qp.Handle())
	return C.int(qp.ID)
}

func qpAttrFromC(a *C.struct_ibv_qp_attr) bridge.QPAttr {
	ah := &a.ah_attr
	return bridge.QPAttr{State: int(a.qp_state), CurState: int(a.cur_qp_state), PathMTU: int(a.path_mtu),
		QKey: uint32(a.qkey), RQPSN: uint32(a.rq_psn), SQPSN: uint32(a.sq_psn), DestQPN: uint32(a.dest_qp_num),
		AccessFlags: int(a.qp_access_flags), PKeyIndex: int(a.pkey_index), Port: int(a.port_num),
		Timeout: uint8(a.timeout), RetryCnt: uint8(a.retry_cnt), RNRRetry: uint8(a.rnr_retry),
		MinRNRTimer: uint8(a.min_rnr_timer), MaxRDAtomic: uint8(a.max_rd_atomic), MaxDestRDAtomic: uint8(a.max_dest_rd_atomic),
		AH: ahFromC(ah)}
}

func ahFromC(ah *C.struct_ibv_ah_attr) bridge.AHAttr {
	return bridge.AHAttr{IsGlobal: ah.is_global != 0, DGID: *(*[16]byte)(unsafe.Pointer(&ah.grh.dgid)),
		SGIDIndex: int(ah.grh.sgid_index), HopLimit: uint8(ah.grh.hop_limit), TrafficClass: uint8(ah.grh.traffic_class),
		FlowLabel: uint32(ah.grh.flow_label), PortNum: int(ah.port_num)}
}

//export vfgoModifyQP
func vfgoModifyQP(id C.uint32_t, a *C.struct_ibv_qp_attr, mask C.int) C.int {
	qp := bridge.QPByID(uint32(id))
	if qp == nil || a == nil {
		return C.int(syscall.EINVAL)
	}
	b := qpAttrFromC(a)
	if err := qp.Modify(&b, int(mask)); err != nil {
		return -neg(err)
	}
	return 0
}

//export vfgoQueryQP
func vfgoQueryQP(id C.uint32_t, a *C.struct_ibv_qp_attr, init *C.struct_ibv_qp_init_attr) C.int {
	qp := bridge.QPByID(uint32(id))
	if qp == nil {
		return C.int(syscall.EINVAL)
	}
	q, err := qp.Query()
	if err != nil {
		return -neg(err)
	}
	C.memset(unsafe.Pointer(a), 0, C.sizeof_struct_ibv_qp_attr)
	a.qp_state = uint32(q.State)
	a.cur_qp_state = uint32(q.CurState)
	a.path_mtu = uint32(q.PathMTU)
	a.qkey = C.uint32_t(q.QKey)
	a.rq_psn = C.uint32_t(q.RQPSN)
	a.sq_psn = C.uint32_t(q.SQPSN)
	a.dest_qp_num = C.uint32_t(q.DestQPN)
	a.qp_access_flags = C.uint(q.AccessFlags)
	a.pkey_index = C.uint16_t(q.PKeyIndex)
	a.port_num = C.uint8_t(q.Port)
	a.timeout = C.uint8_t(q.Timeout)
	a.retry_cnt = C.uint8_t(q.RetryCnt)
	a.rnr_retry = C.uint8_t(q.RNRRetry)
	a.min_rnr_timer = C.uint8_t(q.MinRNRTimer)
	a.max_rd_atomic = C.uint8_t(q.MaxRDAtomic)
	a.max_dest_rd_atomic = C.uint8_t(q.MaxDestRDAtomic)
	a.cap.max_send_wr = C.uint32_t(q.Cap.MaxSendWR)
	a.cap.max_recv_wr = C.uint32_t(q.Cap.MaxRecvWR)
	a.cap.max_send_sge = C.uint32_t(q.Cap.MaxSendSGE)
	a.cap.max_recv_sge = C.uint32_t(q.Cap.MaxRecvSGE)
	a.cap.max_inline_data = C.uint32_t(q.Cap.MaxInlineData)
	ah := &a.ah_attr
	if q.AH.IsGlobal {
		ah.is_global = 1
	}
	*(*[16]byte)(unsafe.Pointer(&ah.grh.dgid)) = q.AH.DGID
	ah.grh.sgid_index = C.uint8_t(q.AH.SGIDIndex)
	ah.grh.hop_limit = C.uint8_t(q.AH.HopLimit)
	ah.grh.traffic_class = C.uint8_t(q.AH.TrafficClass)
	ah.grh.flow_label = C.uint32_t(q.AH.FlowLabel)
	ah.port_num = C.uint8_t(q.AH.PortNum)
	if init != nil {
		init.cap = a.cap
		init.sq_sig_all = 0
	}
	return 0
}

//export vfgoDestroyQP
func vfgoDestroyQP(id C.uint32_t) C.int {
	qp := bridge.QPByID(uint32(id))
	if qp == nil {
		return C.int(syscall.EINVAL)
	}
	if err := qp.Destroy(); err != nil {
		return -neg(err)
	}
	return 0
}

// vfgoPostSend is ops.post_send: one crossing for the whole list, which is
// copied into the QP's scratch and posted in runs of at most the queue's
// depth. It returns an errno, with *bad at the first request refused.
//
//export vfgoPostSend
func vfgoPostSend(id C.uint32_t, wr *C.struct_vf_send_wr, bad **C.struct_vf_send_wr) C.int {
	qp := bridge.QPByID(uint32(id))
	if qp == nil {
		*bad = wr
		return C.int(syscall.EINVAL)
	}
	for wr != nil {
		reqs := qp.BeginSend()
		first := wr
		n := 0
		for ; wr != nil && n < len(reqs); wr = wr.next {
			r := &reqs[n]
			r.WRID = uint64(wr.wr_id)
			r.Opcode = uint32(wr.opcode)
			r.Flags = uint32(wr.send_flags)
			r.ImmBE = uint32(wr.imm_data)
			r.NumSGE = int(wr.num_sge)
			if r.NumSGE > 0 && r.NumSGE <= len(r.SGEs) {
				copy(r.SGEs[:r.NumSGE], unsafe.Slice((*vfrdma.SGE)(unsafe.Pointer(wr.sg_list)), r.NumSGE))
			}
			r.RemoteAddr = uint64(wr.w0)
			r.RKey = uint32(wr.w1)
			r.CompareAdd = uint64(wr.w1)
			r.Swap = uint64(wr.w2)
			r.AH, r.RemoteQPN, r.RemoteQKey = 0, 0, 0
			switch r.Opcode {
			case bridge.WRAtomicCmpSwp, bridge.WRAtomicFetchAdd:
				r.RKey = uint32(wr.w3)
			case bridge.WRSend, bridge.WRSendWithImm:
				if wr.w0 != 0 {
					r.AH = uint32((*C.struct_vf_ah)(*(*unsafe.Pointer)(unsafe.Pointer(&wr.w0))).id)
				}
				r.RemoteQPN = uint32(wr.w1)
				r.RemoteQKey = uint32(wr.w1 >> 32)
			}
			n++
		}
		posted, err := qp.PostSend(n)
		if err != nil || posted < n {
			b := first
			for range posted {
				b = b.next
			}
			*bad = b
			if err == nil {
				return C.int(syscall.ENOMEM)
			}
			return -neg(err)
		}
	}
	return 0
}

//export vfgoPostRecv
func vfgoPostRecv(id C.uint32_t, wr *C.struct_ibv_recv_wr, bad **C.struct_ibv_recv_wr) C.int {
	qp := bridge.QPByID(uint32(id))
	if qp == nil {
		*bad = wr
		return C.int(syscall.EINVAL)
	}
	return postRecvList(qp.BeginRecv, qp.PostRecv, wr, bad)
}

//export vfgoPostSRQRecv
func vfgoPostSRQRecv(id C.uint32_t, wr *C.struct_ibv_recv_wr, bad **C.struct_ibv_recv_wr) C.int {
	s := bridge.SRQByID(uint32(id))
	if s == nil {
		*bad = wr
		return C.int(syscall.EINVAL)
	}
	return postRecvList(s.BeginRecv, s.PostRecv, wr, bad)
}

// postRecvList posts a receive list in runs of the scratch's length:
// begin takes the scratch, post posts it and gives it back.
func postRecvList(begin func() []bridge.RecvReq, post func(int) (int, error), wr *C.struct_ibv_recv_wr, bad **C.struct_ibv_recv_wr) C.int {
	for wr != nil {
		reqs := begin()
		if len(reqs) == 0 { // a QP of an SRQ: PostRecv refuses it
			_, err := post(0)
			*bad = wr
			return -neg(err)
		}
		first := wr
		n := 0
		for ; wr != nil && n < len(reqs); wr = wr.next {
			r := &reqs[n]
			r.WRID = uint64(wr.wr_id)
			r.NumSGE = int(wr.num_sge)
			if r.NumSGE > 0 && r.NumSGE <= len(r.SGEs) {
				copy(r.SGEs[:r.NumSGE], unsafe.Slice((*vfrdma.SGE)(unsafe.Pointer(wr.sg_list)), r.NumSGE))
			}
			n++
		}
		posted, err := post(n)
		if err != nil || posted < n {
			b := first
			for range posted {
				b = b.next
			}
			*bad = b
			if err == nil {
				return C.int(syscall.ENOMEM)
			}
			return -neg(err)
		}
	}
	return 0
}

//export vfgoCreateSRQ
func vfgoCreateSRQ(pdID C.uint32_t, a *C.struct_ibv_srq_attr, user *C.struct_vf_srq) C.int {
	pd := bridge.PDByID(uint32(pdID))
	if pd == nil {
		return -C.int(syscall.EINVAL)
	}
	s, err := pd.CreateSRQ(bridge.SRQAttr{MaxWR: int(a.max_wr), MaxSGE: int(a.max_sge), Limit: int(a.srq_limit)})
	if err != nil {
		return neg(err)
	}
	s.User = unsafe.Pointer(user)
	q := s.Query()
	a.max_wr = C.uint32_t(q.MaxWR)
	a.max_sge = C.uint32_t(q.MaxSGE)
	user.ibv.handle = C.uint32_t(s.ID)
	return C.int(s.ID)
}

//export vfgoModifySRQ
func vfgoModifySRQ(id C.uint32_t, a *C.struct_ibv_srq_attr, mask C.int) C.int {
	s := bridge.SRQByID(uint32(id))
	if s == nil || a == nil {
		return C.int(syscall.EINVAL)
	}
	if err := s.Modify(bridge.SRQAttr{MaxWR: int(a.max_wr), MaxSGE: int(a.max_sge), Limit: int(a.srq_limit)}, int(mask)); err != nil {
		return -neg(err)
	}
	return 0
}

//export vfgoQuerySRQ
func vfgoQuerySRQ(id C.uint32_t, a *C.struct_ibv_srq_attr) C.int {
	s := bridge.SRQByID(uint32(id))
	if s == nil || a == nil {
		return C.int(syscall.EINVAL)
	}
	q := s.Query()
	a.max_wr = C.uint32_t(q.MaxWR)
	a.max_sge = C.uint32_t(q.MaxSGE)
	a.srq_limit = C.uint32_t(q.Limit)
	return 0
}

//export vfgoDestroySRQ
func vfgoDestroySRQ(id C.uint32_t) C.int {
	s := bridge.SRQByID(uint32(id))
	if s == nil {
		return C.int(syscall.EINVAL)
	}
	if err := s.Destroy(); err != nil {
		return -neg(err)
	}
	return 0
}

//export vfgoCreateAH
func vfgoCreateAH(pdID C.uint32_t, a *C.struct_ibv_ah_attr) C.int {
	pd := bridge.PDByID(uint32(pdID))
	if pd == nil || a == nil {
		return -C.int(syscall.EINVAL)
	}
	ah, err := pd.CreateAH(ahFromC(a))
	if err != nil {
		return neg(err)
	}
	return C.int(ah.ID)
}

//export vfgoDestroyAH
func vfgoDestroyAH(id C.uint32_t) C.int {
	ah := bridge.AHByID(uint32(id))
	if ah == nil {
		return C.int(syscall.EINVAL)
	}
	if err := ah.Destroy(); err != nil {
		return -neg(err)
	}
	return 0
}

//export vfgoGetAsyncEvent
func vfgoGetAsyncEvent(id C.uint32_t, typ *C.int, obj *unsafe.Pointer, port *C.int) C.int {
	c := bridge.ContextByID(uint32(id))
	if c == nil {
		return -C.int(syscall.EINVAL)
	}
	e, err := c.NextAsyncEvent()
	if err != nil {
		if errors.Is(err, syscall.EAGAIN) {
			return -C.int(syscall.EAGAIN)
		}
		return neg(err)
	}
	*typ = C.int(e.Type)
	*obj = e.User
	*port = C.int(e.Port)
	return 0
}
