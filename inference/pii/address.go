package pii

import (
	"net/netip"
	"strings"
)

// ipv6 examines the run of hex digits, colons and dots around the colon at
// colon and matches it when it parses as an IPv6 address. It also returns
// where the run ends so the caller skips it either way.
func ipv6(text string, from, colon int) (Match, int) {
	start := colon
	for start > from && (isHex(text[start-1]) || text[start-1] == ':') {
		start--
	}
	end := colon
	colons := 0
	for end < len(text) && (isHex(text[end]) || text[end] == ':' || text[end] == '.') {
		if text[end] == ':' {
			colons++
		}
		end++
	}
	// A sentence may end right after the address.
	for end > colon && text[end-1] == '.' {
		end--
	}
	if colons < 2 || end-start > 45 || (start > 0 && isWord(text[start-1])) || !endsWord(text, end) {
		return Match{}, end
	}
	// Eight groups take seven colons, six and an IPv4 address six, and
	// fewer need "::": other runs (a time, 12:30:45) are no address,
	// known without the parse, which allocates its error.
	run := text[start:end]
	if n := strings.Count(run, ":"); n < 7 && !strings.Contains(run, "::") && (n < 6 || !strings.Contains(run, ".")) {
		return Match{}, end
	}
	a, err := netip.ParseAddr(run)
	if err != nil || !a.Is6() || pythonSlice(run) {
		return Match{}, end
	}
	return Match{IPv6, start, end}, end
}

// pythonSlice reports a run of decimal digits and colons with fewer
// than two numbers ("::2", "1::2", as in x[..., 1::2]): a slice to a
// reader, though "::2" parses as an address.
func pythonSlice(run string) bool {
	numbers := 0
	for _, f := range strings.Split(run, ":") {
		if f == "" {
			continue
		}
		for k := 0; k < len(f); k++ {
			if !isDigit(f[k]) {
				return false
			}
		}
		numbers++
	}
	return numbers < 3
}

func isHex(c byte) bool {
	return isDigit(c) || ((c|0x20) >= 'a' && (c|0x20) <= 'f')
}

// ibanLengths is the IBAN length of each country in the ISO 13616 registry.
var ibanLengths = map[string]int{
	"AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22, "BR": 29,
	"BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DK": 18, "DO": 28, "EE": 20, "EG": 29,
	"ES": 24, "FI": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28,
	"HR": 21, "HU": 28, "IE": 22, "IL": 23, "IQ": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20,
	"LB": 28, "LC": 32, "LI": 21, "LT": 20, "LU": 20, "LV": 21, "MC": 27, "MD": 24, "ME": 22, "MK": 19,
	"MR": 27, "MT": 31, "MU": 30, "NL": 18, "NO": 15, "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29,
	"RO": 24, "RS": 22, "SA": 24, "SC": 31, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "TN": 24, "TR": 26,
	"UA": 29, "VA": 22, "VG": 24, "XK": 20,
}

// iban matches an IBAN in either case, written compactly or in groups of
// four apart by a space or a dash ("GB82 WEST 1234 5698 7654 32",
// "gb82-west-..."), of its country's length and with a valid mod-97
// check. It may follow letters ("ibanGB82..."), as the numbers do: the
// check is what tells an IBAN.
func iban(text string, i int) Match {
	if i+4 > len(text) || !isAlpha(text[i+1]) || !isDigit(text[i+2]) || !isDigit(text[i+3]) {
		return Match{}
	}
	want, ok := ibanLengths[string([]byte{upper(text[i]), upper(text[i+1])})]
	if !ok {
		return Match{}
	}
	var buf [34]byte
	n := 0
	j := i
	end := i
	for j < len(text) && n < want {
		c := text[j]
		if isDigit(c) || isAlpha(c) {
			buf[n] = upper(c)
			n++
			j++
			end = j
			continue
		}
		// A separator only between groups of four.
		if (c == ' ' || c == '-') && n%4 == 0 && j+1 < len(text) && (isDigit(text[j+1]) || isAlpha(text[j+1])) {
			j++
			continue
		}
		break
	}
	if n != want || !endsWord(text, end) || !mod97(buf[:n]) {
		return Match{}
	}
	return Match{IBAN, i, end}
}

func upper(c byte) byte {
	if c >= 'a' && c <= 'z' {
		return c - 'a' + 'A'
	}
	return c
}

// mod97 is the ISO 7064 check: move the first four characters to the end,
// read letters as 10–35, and the number mod 97 must be 1.
func mod97(s []byte) bool {
	r := 0
	add := func(c byte) {
		if isDigit(c) {
			r = (r*10 + int(c-'0')) % 97
			return
		}
		v := int(c-'A') + 10
		r = (r*100 + v) % 97
	}
	for _, c := range s[4:] {
		add(c)
	}
	for _, c := range s[:4] {
		add(c)
	}
	return r == 1
}
