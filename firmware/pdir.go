package firmware

import "fmt"

// Page-directory geometry (pvrdma_dev_api.h): a directory page of 512
// table addresses, tables of 512 page addresses, every entry a 64-bit DMA
// address. Only one directory is ever used.
const (
	// PageSize is the device's page size; QEMU requires 4 KiB host pages.
	PageSize = 4096
	// EntriesPerPage is the number of 64-bit entries in a directory or table.
	EntriesPerPage = PageSize / 8
	// MaxPageDirPages is the most pages one directory can list.
	MaxPageDirPages = EntriesPerPage * EntriesPerPage
	// MaxRingChunks is QEMU 7.2's limit on a ring's pages: CQ and SRQ
	// nchunks (the state page included), and a QP's send pages and
	// receive pages each.
	MaxRingChunks = 128
)

// Page is one page of DMA memory: the address the device uses and the CPU
// mapping of the same page (at least PageSize bytes).
type Page struct {
	DMA uint64
	Mem []byte
}

// checkDMA checks a DMA address the device will map as a page.
func checkDMA(where, field string, a uint64) error {
	if a == 0 {
		return invalid(where, field, a, "a non-zero DMA address (QEMU crashes on a zero entry)")
	}
	if a%PageSize != 0 {
		return invalid(where, field, a, "a page-aligned DMA address")
	}
	return nil
}

func checkPage(where string, p Page) error {
	if err := checkDMA(where, "DMA", p.DMA); err != nil {
		return err
	}
	if len(p.Mem) < PageSize {
		return invalid(where, "len(Mem)", uint64(len(p.Mem)), fmt.Sprintf(">= %d", PageSize))
	}
	return nil
}

// TablesFor returns how many page tables a directory of n pages needs.
func TablesFor(n int) int {
	if n <= 0 {
		return 0
	}
	return (n-1)/EntriesPerPage + 1
}

// WritePageDir fills a multi-table page directory listing pages, the layout
// of a memory region: dir gets the addresses of the tables, table t lists
// pages[512t : 512t+512]. It needs exactly TablesFor(len(pages)) tables.
// Unused entries are zeroed. Every address must be non-zero and
// page-aligned (QEMU remaps MR pages and crashes later on a zero entry).
func WritePageDir(dir Page, tables []Page, pages []uint64) error {
	const where = "page directory"
	if len(pages) == 0 || len(pages) > MaxPageDirPages {
		return invalid(where, "pages", uint64(len(pages)), fmt.Sprintf("1..%d", MaxPageDirPages))
	}
	if want := TablesFor(len(pages)); len(tables) != want {
		return invalid(where, "tables", uint64(len(tables)), fmt.Sprintf("%d for %d pages", want, len(pages)))
	}
	if err := checkPage("page directory", dir); err != nil {
		return err
	}
	for _, t := range tables {
		if err := checkPage("page table", t); err != nil {
			return err
		}
	}
	for i, a := range pages {
		if err := checkDMA(where, fmt.Sprintf("pages[%d]", i), a); err != nil {
			return err
		}
	}
	clear(dir.Mem[:PageSize])
	for t, tbl := range tables {
		le.PutUint64(dir.Mem[8*t:], tbl.DMA)
		clear(tbl.Mem[:PageSize])
		n := min(EntriesPerPage, len(pages)-t*EntriesPerPage)
		for e := range n {
			le.PutUint64(tbl.Mem[8*e:], pages[t*EntriesPerPage+e])
		}
	}
	return nil
}

// WriteRingPageDir fills the single-table page directory of a ring object
// (CQ, QP, SRQ, and the DSR's device rings): the directory's entry 0 is the
// table, the table's entry 0 is the ring-state page, then the data pages in
// order (for a QP: the send pages, then the receive pages). The device reads
// only the first table, so state + data must fit in 512 entries; the
// per-object limits (MaxRingChunks) are checked by the Create*Request
// validators and DSR.Encode.
func WriteRingPageDir(dir, table Page, state uint64, data []uint64) error {
	const where = "ring page directory"
	if len(data) == 0 || len(data)+1 > EntriesPerPage {
		return invalid(where, "data pages", uint64(len(data)), fmt.Sprintf("1..%d", EntriesPerPage-1))
	}
	if err := checkPage("page directory", dir); err != nil {
		return err
	}
	if err := checkPage("page table", table); err != nil {
		return err
	}
	if err := checkDMA(where, "state page", state); err != nil {
		return err
	}
	for i, a := range data {
		if err := checkDMA(where, fmt.Sprintf("data[%d]", i), a); err != nil {
			return err
		}
	}
	clear(dir.Mem[:PageSize])
	clear(table.Mem[:PageSize])
	le.PutUint64(dir.Mem[0:], table.DMA)
	le.PutUint64(table.Mem[0:], state)
	for i, a := range data {
		le.PutUint64(table.Mem[8*(i+1):], a)
	}
	return nil
}
