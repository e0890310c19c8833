package firmware

import (
	"encoding/binary"
	"fmt"
	"syscall"
)

// Sizes of the command channel's structures (pvrdma_dev_api.h).
const (
	// CmdSlotSize is the size of the request union: every request is
	// written as this many bytes, zero-filled past its own fields.
	CmdSlotSize = 184
	// RespSlotSize is the size of the response union.
	RespSlotSize = 176
	// HeaderSize is the size of the request and of the response header.
	HeaderSize = 16
)

// RespFlag is set in every response code: ack = command code | RespFlag.
const RespFlag uint32 = 1 << 31

// Cmd is a command code, written at offset 8 of the request header.
type Cmd uint32

// Command codes.
const (
	CmdQueryPort   Cmd = 0
	CmdQueryPKey   Cmd = 1
	CmdCreatePD    Cmd = 2
	CmdDestroyPD   Cmd = 3
	CmdCreateMR    Cmd = 4
	CmdDestroyMR   Cmd = 5
	CmdCreateCQ    Cmd = 6
	CmdResizeCQ    Cmd = 7
	CmdDestroyCQ   Cmd = 8
	CmdCreateQP    Cmd = 9
	CmdModifyQP    Cmd = 10
	CmdQueryQP     Cmd = 11
	CmdDestroyQP   Cmd = 12
	CmdCreateUC    Cmd = 13
	CmdDestroyUC   Cmd = 14
	CmdCreateBind  Cmd = 15
	CmdDestroyBind Cmd = 16
	CmdCreateSRQ   Cmd = 17
	CmdModifySRQ   Cmd = 18
	CmdQuerySRQ    Cmd = 19
	CmdDestroySRQ  Cmd = 20
	// NumCmds is one past the last command code.
	NumCmds = 21
)

var cmdNames = [NumCmds]string{
	"QUERY_PORT", "QUERY_PKEY", "CREATE_PD", "DESTROY_PD", "CREATE_MR",
	"DESTROY_MR", "CREATE_CQ", "RESIZE_CQ", "DESTROY_CQ", "CREATE_QP",
	"MODIFY_QP", "QUERY_QP", "DESTROY_QP", "CREATE_UC", "DESTROY_UC",
	"CREATE_BIND", "DESTROY_BIND", "CREATE_SRQ", "MODIFY_SRQ", "QUERY_SRQ",
	"DESTROY_SRQ",
}

func (c Cmd) String() string {
	if c < NumCmds {
		return cmdNames[c]
	}
	return fmt.Sprintf("CMD_%d", uint32(c))
}

// Ack returns the response code the device acknowledges c with.
func (c Cmd) Ack() uint32 { return uint32(c) | RespFlag }

// A Request is a command the device executes.
type Request interface {
	// Cmd returns the command code written into the header.
	Cmd() Cmd
	// Encode writes the request into b, a command slot of at least
	// CmdSlotSize bytes: it zero-fills the first CmdSlotSize bytes, writes
	// the header (the command code; the cookie is left zero, see
	// EncodeRequest) and the request's fields. It fails only if b is too
	// short.
	Encode(b []byte) error
}

// A Response is the payload the device writes for a command.
type Response interface {
	// Decode reads the payload from b, a response slot of at least
	// RespSlotSize bytes whose header has already been checked
	// (CheckResponse). It fails if b is too short or a field is out of range.
	Decode(b []byte) error
}

// validator is implemented by requests with limits to check before sending.
type validator interface {
	Validate() error
}

// acker is implemented by requests acknowledged with a code other than
// Cmd().Ack() (QEMU 7.2's swapped SRQ commands).
type acker interface {
	ack() uint32
}

// named is implemented by requests reported under another name than their
// code's (the swapped SRQ commands).
type named interface {
	op() string
}

func opName(r Request) string {
	if n, ok := r.(named); ok {
		return n.op()
	}
	return r.Cmd().String()
}

// ackOf returns the response code expected for r.
func ackOf(r Request) uint32 {
	if a, ok := r.(acker); ok {
		return a.ack()
	}
	return r.Cmd().Ack()
}

// EncodeRequest writes r into the command slot b and stamps cookie into the
// header; the device copies the cookie into the response header.
func EncodeRequest(b []byte, cookie uint64, r Request) error {
	if err := r.Encode(b); err != nil {
		return err
	}
	le.PutUint64(b[0:], cookie)
	return nil
}

// RespHeader is the header of a response: the request's cookie copied back,
// the acknowledgement code, and an error byte (QEMU: a positive errno when
// the command failed).
type RespHeader struct {
	Cookie uint64
	Ack    uint32
	Err    uint8
}

// DecodeRespHeader reads the header of the response slot b.
func DecodeRespHeader(b []byte) (RespHeader, error) {
	if len(b) < HeaderSize {
		return RespHeader{}, invalid("response slot", "length", uint64(len(b)), fmt.Sprintf(">= %d", HeaderSize))
	}
	return RespHeader{Cookie: le.Uint64(b[0:]), Ack: le.Uint32(b[8:]), Err: b[12]}, nil
}

// CheckResponse checks the header of the response slot b against the
// request it answers: the cookie and the acknowledgement must match and the
// error byte must be zero. A mismatch wraps ErrDeviceFault; a non-zero error
// byte is returned as a [syscall.Errno].
func CheckResponse(b []byte, cookie uint64, ack uint32) error {
	h, err := DecodeRespHeader(b)
	if err != nil {
		return err
	}
	if h.Cookie != cookie {
		return fault("response", "cookie", h.Cookie, fmt.Sprintf("%#x", cookie))
	}
	if h.Ack != ack {
		return fault("response", "ack", uint64(h.Ack), fmt.Sprintf("%#x", ack))
	}
	if h.Err != 0 {
		return fmt.Errorf("response header error byte %d: %w", h.Err, syscall.Errno(h.Err))
	}
	return nil
}

var le = binary.LittleEndian

// beginRequest checks the slot size, zero-fills it and writes the code.
func beginRequest(b []byte, c Cmd) error {
	if len(b) < CmdSlotSize {
		return invalid(c.String()+" request", "slot length", uint64(len(b)), fmt.Sprintf(">= %d", CmdSlotSize))
	}
	clear(b[:CmdSlotSize])
	le.PutUint32(b[8:], uint32(c))
	return nil
}

// checkResp checks the response slot size for decoding.
func checkResp(b []byte, c Cmd) error {
	if len(b) < RespSlotSize {
		return invalid(c.String()+" response", "slot length", uint64(len(b)), fmt.Sprintf(">= %d", RespSlotSize))
	}
	return nil
}

// HandleMask is the largest QP, CQ or SRQ handle a doorbell can carry.
const HandleMask = 0x00FFFFFF

// checkHandle checks a handle the device returned for a doorbell object.
func checkHandle(c Cmd, field string, h uint32) error {
	if h > HandleMask {
		return fault(c.String()+" response", field, uint64(h), "<= 0xffffff (doorbell handle)")
	}
	return nil
}

func isPow2(v uint64) bool { return v != 0 && v&(v-1) == 0 }
