package pii

import (
	"fmt"
	"strings"
	"testing"
)

func TestFind(t *testing.T) {
	cases := []struct {
		text string
		want []string // "kind:matched text"
	}{
		{"write to jane.doe+ai@mail.example.co.uk today", []string{"email:jane.doe+ai@mail.example.co.uk"}},
		{"end of sentence a@b.io.", []string{"email:a@b.io"}},
		{"not an address: user@localhost or @handle or a@b.c1", nil},
		{"card 4111 1111 1111 1111 ok", []string{"credit-card:4111 1111 1111 1111"}},
		{"card 4111-1111-1111-1111", []string{"credit-card:4111-1111-1111-1111"}},
		{"mc 5555555555554444, amex 378282246310005", []string{"credit-card:5555555555554444", "credit-card:378282246310005"}},
		{"bad luhn 4111 1111 1111 1112", nil},
		{"unknown issuer 9111111111111111 passes Luhn? no matter", nil},
		{"mixed separators 4111 1111-1111 1111", []string{"credit-card:4111 1111-1111 1111"}},
		{"spaced dashes 4111 - 1111 - 1111 - 1111.", []string{"credit-card:4111 - 1111 - 1111 - 1111"}},
		{"too much between groups 4111 -- - 1111 1111 1111", nil},
		{"too long 41111111111111111111111", nil},
		{"ssn 078-05-1120.", []string{"ssn:078-05-1120"}},
		{"ssn 123 45 6789", []string{"ssn:123 45 6789"}},
		{"invalid ssn 000-12-3456 666-12-3456 900-12-3456 123-00-4567 123-45-0000", nil},
		{"bare nine digits 123456789", nil},
		// Numbers apart by spaces alone are an SSN or a phone number only
		// when they stand alone, not in a list of numbers.
		{"matrix row [[ 123   45 6789]", nil},
		{"row 12 123 45 6789 and 123 45 6789 7 and 123 45 6789, 8", nil},
		{"numpy floats array([[512.  64. 2048.]]) 512. 64. 2048.", nil},
		{"float serial 123 45 6789.5", nil},
		{"shape (123, 45, 6789)", nil},
		{"ssn 123 45 6789, dob in 1990", []string{"ssn:123 45 6789"}},
		{"social security number: 123 45 6789", []string{"ssn:123 45 6789"}},
		{"my social is 078 05 1120", []string{"ssn:078 05 1120"}},
		{"spaced phone 555 123 4567 alone", []string{"phone:555 123 4567"}},
		{"phone row 555 123 4567 89 and [555 123 4567]", nil},
		{"area code from 2: 123-456-7890 and (123) 456-7890", nil},
		{"dashes are not a list: 078-05-1120 12", []string{"ssn:078-05-1120"}},
		{"versions and OIDs: AssemblyVersion(\"4.0.0.0\"), Version=1.2.3.4, file version 4.2.1.17, OID 2.5.4.3, v 1.1.1.1", nil},
		{"after another word 4.2.1.17 is an address", []string{"ipv4:4.2.1.17"}},
		{"python slices x[..., ::2], x[..., 1::2] but ::1 fe80::1", []string{"ipv6:fe80::1"}},
		{"cards one after another 4111 1111 1111 1111 5555 5555 5555 4444", []string{"credit-card:4111 1111 1111 1111", "credit-card:5555 5555 5555 4444"}},
		{"a card then its expiry 4111 1111 1111 1111 0427 737", []string{"credit-card:4111 1111 1111 1111"}},
		{"a row of four-digit values 5814 2907 8722 4361 13084 and 5386 2693 8080 4040 2020 1010", nil},
		{"two decimals 6234.118840 200.921473", nil},
		{"a code in the card's own groups 4821-0093-7716-2045-66", nil},
		{"a row 123 45 6789 and, with its label, SSN 123 45 6789", []string{"ssn:123 45 6789"}},
		{"float exponent 4.118e+00   4.886 1.23e-06 and +0 20 7946 0958", nil},
		{"call (555) 123-4567 now", []string{"phone:(555) 123-4567"}},
		{"call 555-123-4567 or 555.123.4567", []string{"phone:555-123-4567", "phone:555.123.4567"}},
		{"london +44 20 7946 0958", []string{"phone:+44 20 7946 0958"}},
		{"us +1 (415) 555-2671", []string{"phone:+1 (415) 555-2671"}},
		{"compact +14155552671", []string{"phone:+14155552671"}},
		{"too short +123 45", nil},
		{"order 12345678 and 2024-01-15 and 10:30", nil},
		{"host 192.168.1.10 and 10.0.0.1", []string{"ipv4:192.168.1.10", "ipv4:10.0.0.1"}},
		{"not ip 256.1.1.1, 1.2.3.4.5, v1.2.3.4, 01.2.3.4", nil},
		{"v6 2001:db8::ff00:42:8329 and fe80::1.", []string{"ipv6:2001:db8::ff00:42:8329", "ipv6:fe80::1"}},
		{"time 12:30:45, mac 00:1A:2B:3C:4D:5E, std::vector", nil},
		{"iban GB82 WEST 1234 5698 7654 32 paid", []string{"iban:GB82 WEST 1234 5698 7654 32"}},
		{"iban DE89370400440532013000", []string{"iban:DE89370400440532013000"}},
		{"bad iban DE89370400440532013001 and XX12345678901234", nil},
		{"two kinds: bob@x.org 078-05-1120", []string{"email:bob@x.org", "ssn:078-05-1120"}},
		{"glued abc4111111111111111", []string{"credit-card:4111111111111111"}},
		{"glued both sides card4111111111111111exp", []string{"credit-card:4111111111111111"}},
		{"glued ssn078-05-1120x", []string{"ssn:078-05-1120"}},
		{"mixed ssn 078-05 1120", []string{"ssn:078-05 1120"}},
		{"glued phone tel555-123-4567ext", []string{"phone:555-123-4567"}},
		{"mixed phone 555.123-4567", []string{"phone:555.123-4567"}},
		{"inside a longer number 1078-05-1120 or 078-05-11201", nil},
		{"version after a letter v1.2.3.4 and ip10.0.0.1", nil},
		{"international address josé@exämple.de ok", []string{"email:josé@exämple.de"}},
		{"Cyrillic domain иван@пример.рф.", []string{"email:иван@пример.рф"}},
		{"A-label tld a@b.xn--p1ai", []string{"email:a@b.xn--p1ai"}},
		{"underscore local first_last@ex.com", []string{"email:first_last@ex.com"}},
		{"unicode é jane@ex.com ü", []string{"email:jane@ex.com"}},
		// An address with its at sign or dots percent-encoded (%40, %2E or
		// %2e), as in a URL or a mailto link, is an address; a percent sign
		// that encodes neither starts nothing.
		{"mailto:jane%40example.com ok", []string{"email:jane%40example.com"}},
		{"jane%40example%2Ecom", []string{"email:jane%40example%2Ecom"}},
		{"jane%40mail%2eexample%2Eco%2Euk.", []string{"email:jane%40mail%2eexample%2Eco%2Euk"}},
		{"jane@example%2Ecom", []string{"email:jane@example%2Ecom"}},
		{"a%2Eb%40ex.com", []string{"email:a%2Eb%40ex.com"}},
		{"one label jane%40localhost", nil},
		{"%40example.com has no local part", nil},
		{"jane%4example.com, jane%400 and jane%41ex.com", nil},
		{"dot not encoded jane%40example%2Fcom", nil},
		{"trailing encoded dot jane%40example.com%2E", []string{"email:jane%40example.com"}},
		{"grew 12.5% to 4,210; 100%", nil},
		{"ends with a percent %", nil},
		{"%4", nil},
	}
	for _, tc := range cases {
		t.Run(tc.text, func(t *testing.T) {
			var got []string
			for _, m := range Find(nil, tc.text, All, -1) {
				got = append(got, m.Kind.String()+":"+tc.text[m.Start:m.End])
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("got %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestFindHonoursSet(t *testing.T) {
	text := "a@b.io 078-05-1120 10.0.0.1"
	set, err := ParseKind("ssn")
	if err != nil {
		t.Fatal(err)
	}
	ms := Find(nil, text, set, -1)
	if len(ms) != 1 || ms[0].Kind != SSN {
		t.Fatalf("got %v", ms)
	}
	ip, _ := ParseKind("ip")
	if !ip.Has(IPv4) || !ip.Has(IPv6) || ip.Has(Email) {
		t.Fatalf("ip set %b", ip)
	}
	if _, err := ParseKind("passport"); err == nil || !strings.Contains(err.Error(), "credit-card") {
		t.Fatalf("err = %v, want the list of kinds", err)
	}
}

func FuzzFind(f *testing.F) {
	for _, s := range []string{"jane@ex.com 4111 1111 1111 1111", "+44 20 7946 0958", "2001:db8::1", "GB82 WEST 1234 5698 7654 32", "078-05-1120 (555) 123-4567"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		prev := 0
		for _, m := range Find(nil, text, All, -1) {
			if m.Start < prev || m.End <= m.Start || m.End > len(text) {
				t.Fatalf("bad match %+v after %d in %q", m, prev, text)
			}
			prev = m.End
		}
	})
}

func BenchmarkFind(b *testing.B) {
	for _, size := range []int{1 << 10, 64 << 10} {
		text := sampleText(size)
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			var ms []Match
			for b.Loop() {
				ms = Find(ms[:0], text, All, -1)
			}
		})
	}
}

// sampleText is prose with a little PII and many numbers, as prompts have.
func sampleText(n int) string {
	const para = "Please summarise the Q3 report: revenue grew 12.5% to 4,210 units across 17 regions (see table 3.2). " +
		"Contact jane.doe@example.com or call (555) 123-4567 about invoice 2024-118. The server at 10.20.30.40 " +
		"logged 3 errors at 12:30:45; ticket ABC-1234 is open. Refund to GB82 WEST 1234 5698 7654 32 if needed.\n"
	var sb strings.Builder
	for sb.Len() < n {
		sb.WriteString(para)
	}
	return sb.String()[:n]
}

// TestMatchAt: MatchAt finds the digit-led kinds and IBANs that start at
// i as if i began the text, where Find would not start one (inside a
// longer number), and nothing else.
func TestMatchAt(t *testing.T) {
	for _, tc := range []struct {
		text string
		i    int
		want string // "kind:matched text", or "" for none
	}{
		{"12344111 1111 1111 1111", 4, "credit-card:4111 1111 1111 1111"},
		{"9078-05-1120", 1, "ssn:078-05-1120"},
		{"1(555) 123-4567", 1, "phone:(555) 123-4567"},
		{"7+44 20 7946 0958", 1, "phone:+44 20 7946 0958"},
		{"1.10.0.0.1", 2, "ipv4:10.0.0.1"},
		{"xGB82 WEST 1234 5698 7654 32", 1, "iban:GB82 WEST 1234 5698 7654 32"},
		{"4111 1111 1111 1111", 0, "credit-card:4111 1111 1111 1111"},
		{"4111 1111 1111 1111", 1, ""}, // 111 1111 1111 1111: no card
		{"x jane@example.com", 2, ""},  // e-mail is not digit-led
		{"x 2001:db8::1", 2, ""},       // nor is an IPv6 address found here
		{"abc", 3, ""},                 // at the end
		{"abc", 7, ""},                 // past it
		{"DE89370400440532013000", 0, "iban:DE89370400440532013000"},
	} {
		t.Run(fmt.Sprintf("%s@%d", tc.text, tc.i), func(t *testing.T) {
			m, ok := MatchAt(tc.text, tc.i, All)
			got := ""
			if ok {
				got = m.Kind.String() + ":" + tc.text[m.Start:m.End]
			}
			if got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
	if _, ok := MatchAt("4111111111111111", 0, Set(0).With(SSN)); ok {
		t.Error("MatchAt found a card outside its set")
	}
}

// TestIPv6NeedsColonsOrEllipsis: a run is parsed as an IPv6 address only
// when it has seven colons, six and an IPv4 tail, or "::"; the check
// before the parse turns away no address.
func TestIPv6NeedsColonsOrEllipsis(t *testing.T) {
	for _, tc := range []struct {
		text string
		want []string
	}{
		{"a 2001:db8:0:0:0:0:2:1 b", []string{"ipv6:2001:db8:0:0:0:0:2:1"}},
		{"a 0:0:0:0:0:ffff:1.2.3.4 b", []string{"ipv6:0:0:0:0:0:ffff:1.2.3.4"}},
		{"a ::ffff:1.2.3.4 b", []string{"ipv6:::ffff:1.2.3.4"}},
		{"a ::1 b", nil}, // loopback, or a Python slice x[::1]: decimal numbers, fewer than three
		{"a 1:: b", nil},
		{"a ::a b", []string{"ipv6:::a"}},
		{"a 2001:db8:0:0:0:2:1 b", nil},            // seven groups
		{"a 0:0:0:0:ffff:1.2.3.4 b", nil},          // five colons before the IPv4 tail
		{"a 1:2:3:4:5:6:7 b", nil},                 // six colons, no tail
		{"at 12:30:45 and 00:1A:2B:3C:4D:5E", nil}, // a time, a MAC address
	} {
		t.Run(tc.text, func(t *testing.T) {
			var got []string
			for _, m := range Find(nil, tc.text, Set(0).With(IPv6), -1) {
				got = append(got, m.Kind.String()+":"+tc.text[m.Start:m.End])
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("got %q\nwant %q", got, tc.want)
			}
		})
	}
}
