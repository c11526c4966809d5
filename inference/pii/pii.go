// Package pii finds personal data in text: e-mail addresses, payment card
// numbers, US social security numbers, phone numbers, IP addresses and
// IBANs. The detectors are hand-written scanners rather than regular
// expressions so that one pass over a 64 KiB prompt stays well under a
// millisecond, also inside a Wasm guest, and each one validates what it can
// (Luhn and issuer prefixes for cards, mod-97 and country length for IBANs,
// octet ranges for IPv4, a full parse for IPv6) to keep false positives low.
//
// The scanners read ASCII forms: callers fold the text first (see
// inference/textnorm) so that full-width digits, Unicode dashes and spaces
// read as the ASCII a model sees in them. Numbers are found even when
// glued to letters ("ssn078-05-1120", "4111111111111111x"), as a model
// reads them; only IPv4 addresses keep whole-word boundaries, so version
// strings ("v1.2.3.4") stay.
package pii

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Kind is one kind of personal data.
type Kind uint8

// The built-in kinds.
const (
	Email Kind = iota + 1
	CreditCard
	SSN
	Phone
	IPv4
	IPv6
	IBAN
	numKinds
)

var kindNames = [numKinds]string{"", "email", "credit-card", "ssn", "phone", "ipv4", "ipv6", "iban"}

func (k Kind) String() string {
	if k == 0 || k >= numKinds {
		return fmt.Sprintf("Kind(%d)", k)
	}
	return kindNames[k]
}

// Kinds lists the built-in kinds by name, for error messages and docs.
func Kinds() []string { return append([]string(nil), kindNames[1:]...) }

// ParseKind maps a name ("email", "credit-card", "ssn", "phone", "ipv4",
// "ipv6", "iban", or "ip" for both IP kinds) to a set.
func ParseKind(name string) (Set, error) {
	if name == "ip" {
		return Set(0).With(IPv4).With(IPv6), nil
	}
	for k := Email; k < numKinds; k++ {
		if kindNames[k] == name {
			return Set(0).With(k), nil
		}
	}
	return 0, fmt.Errorf("unknown detector %q (want one of %s, ip)", name, strings.Join(Kinds(), ", "))
}

// Set is a set of kinds.
type Set uint16

// All holds every built-in kind.
const All Set = 1<<numKinds - 2

// With returns s with k added.
func (s Set) With(k Kind) Set { return s | 1<<k }

// Has reports whether k is in s.
func (s Set) Has(k Kind) bool { return s&(1<<k) != 0 }

// Match is one finding: text[Start:End] is of the given kind.
type Match struct {
	Kind       Kind
	Start, End int
}

// byte classes that can start (or, for '@' and ':', sit inside) a finding.
const (
	clsNone = iota
	clsDigit
	clsAt // '@', or '%' of "%40", an at sign percent-encoded (see atSign)
	clsColon
	clsPlus  // '+' of an international phone number
	clsParen // '(' of a US area code
)

var class = func() (t [256]uint8) {
	for c := '0'; c <= '9'; c++ {
		t[c] = clsDigit
	}
	t['@'], t['%'], t[':'], t['+'], t['('] = clsAt, clsAt, clsColon, clsPlus, clsParen
	return t
}()

// Find appends to dst the findings of the kinds in set, left to right and
// without overlaps, and returns the extended slice. It stops once dst
// holds n findings (n < 0: no limit), so that a caller bounding the
// findings of a request holds no more than its bound, whatever the text.
func Find(dst []Match, text string, set Set, n int) []Match {
	from := 0 // findings never reach back before the end of the previous one
	for i := 0; i < len(text) && len(dst) != n; i++ {
		cls := class[text[i]]
		if cls == clsNone {
			continue
		}
		var m Match
		switch cls {
		case clsDigit, clsPlus, clsParen:
			// Not inside a number, nor in the middle of a dotted number
			// ("1.2.3.4.5" holds no address). After a letter or '_' is
			// fine: "ssn078-05-1120" and "ssn_078-05-1120" are numbers to
			// a model.
			if i > from && (isDigit(text[i-1]) || (text[i-1] == '.' && i-1 > from && isDigit(text[i-2]))) {
				continue
			}
			// An IBAN is found at its check digits, after the country's
			// two letters: letters themselves are not dispatched, which
			// keeps prose cheap to scan.
			if set.Has(IBAN) && i-2 >= from && isAlpha(text[i-1]) && isAlpha(text[i-2]) {
				if m = iban(text, i-2); m.Kind != 0 {
					break
				}
			}
			m = numeric(text, i, set, i > from && (isAlpha(text[i-1]) || text[i-1] == '_'))
		case clsAt:
			if n := atSign(text, i); n > 0 && set.Has(Email) {
				m = email(text, from, i, n)
			}
		case clsColon:
			if set.Has(IPv6) {
				var next int
				m, next = ipv6(text, from, i)
				if m.Kind == 0 {
					i = next - 1 // the run is no address; do not rescan it colon by colon
					continue
				}
			}
		}
		if m.Kind != 0 {
			dst = append(dst, m)
			from = m.End
			i = m.End - 1
		}
	}
	return dst
}

// MatchAt returns the finding of the digit-led kinds and IBAN that
// starts at i as if i began the text (the previous byte no part of a
// number), or ok false. Find does not start a number inside another
// ("1234" holds no number at "34"), so a caller that masks a finding of
// another reading of the text (or of another rule) calls this where that
// finding ends: masking puts a non-digit there, and what starts after it
// must be found in the same pass rather than only once the text is
// masked, or each pass would uncover one more.
func MatchAt(text string, i int, set Set) (Match, bool) {
	if i >= len(text) {
		return Match{}, false
	}
	var m Match
	rest := text[i:] // nothing before i is read: no label, no list
	switch c := rest[0]; {
	case isAlpha(c) && set.Has(IBAN):
		m = iban(rest, 0)
	case class[c] == clsDigit || class[c] == clsPlus || class[c] == clsParen:
		m = numeric(rest, 0, set, false)
	}
	m.Start, m.End = m.Start+i, m.End+i
	return m, m.Kind != 0
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
func isAlpha(c byte) bool { return (c|0x20) >= 'a' && (c|0x20) <= 'z' }
func isWord(c byte) bool  { return isDigit(c) || isAlpha(c) || c == '_' }

// endsWord reports whether a finding ending at i is not glued to more
// letters or digits.
func endsWord(text string, i int) bool { return i >= len(text) || !isWord(text[i]) }

// endsNumber reports whether a number ending at i is not glued to more
// digits; letters may follow.
func endsNumber(text string, i int) bool { return i >= len(text) || !isDigit(text[i]) }

// numeric tries the digit-led kinds at i, most specific first; afterLetter
// says a letter comes just before i.
func numeric(text string, i int, set Set, afterLetter bool) Match {
	if isDigit(text[i]) {
		if set.Has(IPv4) && !afterLetter {
			if end := ipv4(text, i); end > 0 && !versionLabel(text, i) {
				return Match{IPv4, i, end}
			}
		}
		if set.Has(SSN) {
			if end := ssn(text, i); end > 0 {
				return Match{SSN, i, end}
			}
		}
		if set.Has(CreditCard) {
			if end := card(text, i); end > 0 {
				return Match{CreditCard, i, end}
			}
		}
	}
	if set.Has(Phone) {
		if end := phone(text, i); end > 0 {
			return Match{Phone, i, end}
		}
	}
	return Match{}
}

// digitRun returns the end of the run of digits starting at i.
func digitRun(text string, i int) int {
	for i < len(text) && isDigit(text[i]) {
		i++
	}
	return i
}

// versionLabel reports that the word just before i (apart by spaces, a
// quote, "=", "(" or ":") names a version or an object identifier:
// "AssemblyVersion(\"4.0.0.0\")", "version 1.2.3.4", "OID 2.5.4.3",
// "build 10.0.0.1". Four dotted numbers after such a word are not an
// address.
func versionLabel(text string, i int) bool {
	k := i
	for n := 0; k > 0 && n < 4 && strings.IndexByte(" \"'=(:", text[k-1]) >= 0; n++ {
		k--
	}
	j := k
	for j > 0 && isAlpha(text[j-1]) {
		j--
	}
	if j == k {
		return false
	}
	w := strings.ToLower(text[j:k])
	for _, label := range [...]string{"version", "ver", "v", "oid", "release", "build", "firmware", "fw", "rev", "revision"} {
		if w == label || label == "version" && strings.HasSuffix(w, label) {
			return true
		}
	}
	return false
}

// ipv4 matches four dotted decimal octets (0–255, no leading zeros).
func ipv4(text string, i int) int {
	for octet := 0; octet < 4; octet++ {
		if octet > 0 {
			if i >= len(text) || text[i] != '.' {
				return 0
			}
			i++
		}
		end := digitRun(text, i)
		n := end - i
		if n == 0 || n > 3 || (n > 1 && text[i] == '0') {
			return 0
		}
		v := 0
		for _, c := range []byte(text[i:end]) {
			v = v*10 + int(c-'0')
		}
		if v > 255 {
			return 0
		}
		i = end
	}
	// "1.2.3.4.5" is a version number, not an address.
	if i+1 < len(text) && text[i] == '.' && isDigit(text[i+1]) {
		return 0
	}
	if !endsWord(text, i) {
		return 0
	}
	return i
}

// ssn matches AAA-GG-SSSS under the SSA's rules (area not 000, 666 or
// 9xx; group not 00; serial not 0000), the groups apart by a run of up to
// three separators (see sepRun): "078-05-1120", "078 - 05 - 1120",
// "078.05.1120". A serial glued to more digit groups ("391.45
// 2024-02-27", a price then a date) is part of a longer number.
//
// Three numbers apart by white space alone (or a sign: "807 20 -1587")
// are an SSN only after a word that names one ("SSN 078 05 1120", see
// ssnLabel): so written they are far more often values of a row, a
// table or a shape ("[[123   45 6789]", "512 64 2048"), and data-loss
// tools treat such a weak format alike, asking for a keyword nearby.
func ssn(text string, i int) int {
	var groups [3]string
	j := i
	spaces := true
	for g, n := range [...]int{3, 2, 4} {
		if g > 0 {
			k := sepRun(text, j)
			if k == j {
				return 0
			}
			spaces = spaces && spacesOrSign(text[j:k])
			j = k
		}
		if j+n > len(text) || digitRun(text, j) != j+n {
			return 0
		}
		groups[g], j = text[j:j+n], j+n
	}
	area, group, serial := groups[0], groups[1], groups[2]
	if area == "000" || area == "666" || area[0] == '9' || group == "00" || serial == "0000" {
		return 0
	}
	if k := sepRun(text, j); k > j && k < len(text) && isDigit(text[k]) && !strings.Contains(text[j:k], " ") {
		return 0 // glued to more groups: "…1120-99", or a float's whole part ("6789.5")
	}
	if spaces && !ssnLabel(text, i) {
		return 0
	}
	return j
}

// ssnLabelWindow is how far before a spaced SSN its label may stand.
const ssnLabelWindow = 40

// ssnLabel reports that a word naming a social security number stands in
// the ssnLabelWindow bytes before i: "ssn", "social" ("my social is…", "social security"), "ss#",
// "soc sec", "taxpayer" (any case; "SSNs", "ssn:" and "ssn_" count).
func ssnLabel(text string, i int) bool {
	w := strings.ToLower(text[max(0, i-ssnLabelWindow):i])
	for _, label := range [...]string{"ssn", "social", "ss#", "soc sec", "soc. sec", "taxpayer"} {
		if k := strings.LastIndex(w, label); k >= 0 && (k == 0 || !isAlpha(w[k-1])) {
			return true
		}
	}
	return false
}

func onlySpaces(s string) bool { return strings.Trim(s, " ") == "" }

// spacesOrSign: a separator run of spaces, or spaces then the sign of the
// next number (" -1587").
func spacesOrSign(s string) bool {
	if n := len(s); n > 1 && s[n-1] == '-' && s[n-2] == ' ' {
		s = s[:n-1]
	}
	return onlySpaces(s)
}

// space: ASCII white space (the text as sent keeps its line breaks).
func space(c byte) bool { return c == ' ' || c >= '\t' && c <= '\r' }

// inList reports that the number text[i:j], written with spaces between
// its groups (a phone number), is one of a list of numbers rather than one
// number: another number stands just before or after it (apart by spaces,
// a comma or a semicolon: "row sums: 562 111 -659 264 2846",
// "555 123 4567 89"), or a bracket opens or closes the list right at it
// ("[555 123 4567]", as numpy prints an array). A reader takes such a run
// for a row of values, as a model does.
func inList(text string, i, j int) bool {
	_, after := afterNumber(text, j)
	return numberBefore(text, i) || after != 0
}

// numberBefore reports a number (or a bracket opening a list, or the sign
// of a signed value) just before i, apart by spaces and at most one comma
// or semicolon.
func numberBefore(text string, i int) bool {
	k := i
	for k > 0 && space(text[k-1]) {
		k--
	}
	if k > 0 && (text[k-1] == ',' || text[k-1] == ';') {
		k--
		for k > 0 && space(text[k-1]) {
			k--
		}
	}
	if k == 0 {
		return false
	}
	switch c := text[k-1]; {
	case c == '[', isDigit(c), c == '.' && k > 1 && isDigit(text[k-2]):
		return true
	case (c == '-' || c == '+') && k == i && (k == 1 || space(text[k-2]) || text[k-2] == '['):
		return true // a signed value: "[1,]  -362    31  1890"
	}
	return false
}

// afterNumber returns where a number just after j (apart as
// numberBefore says) starts and its digits, -1 for a bracket closing a
// list, 0 for none.
func afterNumber(text string, j int) (int, int) {
	k := j
	for k < len(text) && space(text[k]) {
		k++
	}
	if k < len(text) && (text[k] == ',' || text[k] == ';') {
		k++
		for k < len(text) && space(text[k]) {
			k++
		}
	}
	switch {
	case k >= len(text):
		return k, 0
	case text[k] == ']':
		return k, -1
	}
	return k, digitRun(text, k) - k
}

// groupSep is a byte that may stand between the digit groups of a
// number: a space, a dash, a dot, a slash or an underscore.
func groupSep(c byte) bool { return c == ' ' || c == '-' || c == '.' || c == '/' || c == '_' }

// sepRun returns the end of the run of up to three groupSep bytes at i
// ("4111 - 1111"), or i when there is none. A dot followed by a space
// right after the digits is no separator but the point of a float
// ("512. 64. 2048.", as numpy prints floats).
func sepRun(text string, i int) int {
	const maxSep = 3
	if i+1 < len(text) && text[i] == '.' && text[i+1] == ' ' {
		return i
	}
	j := i
	for j < len(text) && j-i < maxSep && groupSep(text[j]) {
		j++
	}
	return j
}

// card matches 13–19 digits, optionally in groups apart by separators
// (see sepRun), that pass the Luhn check and start with a known issuer
// prefix. Where more groups follow (a card pasted with its expiry and
// security code, "4111 1111 1111 1111 12 27 123"), the longest run of
// whole groups that is a card is: the scan goes back group by group.
func card(text string, i int) int { return cardRun(text, i, true) }

// cardRun is card; inContext: whether the numbers around the card are
// looked at (see cardInList), which a card after a card need not be.
func cardRun(text string, i int, inContext bool) int {
	if digitRun(text, i)-i < 4 {
		return 0 // the first group has four digits or more: most numbers stop here
	}
	var digits [19]byte
	var ends [19]int // ends[n-1]: where a group ends after n digits; 0 if none does
	// same[n-1], spaced[n-1]: the separator runs up to that group were
	// all the same, or all spaces; widths holds the groups' widths. For
	// the checks below.
	var same, spaced [19]bool
	var widths [19]uint8
	n, groups := 0, 0
	j := i
	sep := ""
	allSame, allSpaced := true, true
	for j < len(text) {
		e := digitRun(text, j)
		if e == j || n+e-j > len(digits) {
			break // no group here, or one that takes the number past 19 digits
		}
		if n == 0 && e-j < 4 {
			// Cards are written whole or in groups of 3 or more, the
			// first of 4 (Amex 4-6-5, Diners 4-6-4, the 19-digit
			// 4-4-4-4-3), only the last shorter: other groupings are
			// lists of numbers ("45 6789 987 65 4321").
			break
		}
		for k := j; k < e; k++ {
			digits[n] = text[k] - '0'
			n++
		}
		widths[groups] = uint8(e - j)
		groups++
		ends[n-1], same[n-1], spaced[n-1] = e, allSame, allSpaced
		if e-j < 3 {
			break // a short group ends the card, or an expiry starts after it
		}
		k := sepRun(text, e)
		if k == e || k >= len(text) || !isDigit(text[k]) {
			break
		}
		if j > i && text[j-1] == '.' && onlySpaces(text[e:k]) && decimalAt(text, k) {
			break // two decimals apart by a space ("6234.118840 200.921473"), not one number
		}
		if sep == "" {
			sep = text[e:k]
		}
		allSame = allSame && text[e:k] == sep
		allSpaced = allSpaced && spacesOrSign(text[e:k])
		j = k
	}
	for m := n; m >= 13; m-- {
		end := ends[m-1]
		if end == 0 || !luhn(digits[:m]) || !issuer(digits[:m]) { // a group's end is no digit's
			continue
		}
		if next := nextEnd(ends[:n], m); next > 0 && same[next-1] && digitRun(text, i) < end && !strings.Contains(sep, " ") {
			// The card's groups go on with its own separator
			// ("4821-0093-7716-2045-66"): one longer code.
			continue
		}
		if inContext && spaced[m-1] && cardInList(text, i, end, widthsUpTo(widths[:groups], m)) {
			return 0
		}
		return end
	}
	return 0
}

// decimalAt reports a decimal number at k: digits, a dot, digits.
func decimalAt(text string, k int) bool {
	e := digitRun(text, k)
	return e+1 < len(text) && text[e] == '.' && isDigit(text[e+1])
}

// nextEnd returns the digit count at the end of the group after the one
// that ends at m digits, or 0 when there is none.
func nextEnd(ends []int, m int) int {
	for k := m + 1; k <= len(ends); k++ {
		if ends[k-1] != 0 {
			return k
		}
	}
	return 0
}

// cardInList reports that a card at text[i:end], its groups apart by
// spaces alone (of the widths given), is a run of a list of numbers:
// another number stands before it, or one stands after it unless the
// card is grouped as cards are printed and what follows is no longer
// than an expiry or a security code ("4111 1111 1111 1111 12 27 123").
func cardInList(text string, i, end int, widths []uint8) bool {
	printed := cardGrouping(widths)
	before := numberBefore(text, i)
	if before && !(printed && groupOfFourBefore(text, i)) {
		return true
	}
	k, next := afterNumber(text, end)
	switch {
	case next == 0:
		return false
	case printed && !before && (next <= 3 || next == 4 && (month(text[k:k+2]) || len(widths) == 3 && widths[1] == 6)):
		return false // an expiry (MMYY) or a code after the card
	case next > 0 && cardRun(text, k, false) > 0:
		return false // cards one after another are no list
	}
	return true
}

// groupOfFourBefore reports that the number before i (apart by spaces)
// is a group of four digits: it may end a card written just before,
// and cards one after another are no list.
func groupOfFourBefore(text string, i int) bool {
	k := i
	for k > 0 && space(text[k-1]) {
		k--
	}
	j := k
	for j > 0 && isDigit(text[j-1]) {
		j--
	}
	return k-j == 4 && (j == 0 || !isDigit(text[j-1]))
}

// month reports MM of 01–12.
func month(mm string) bool { return mm >= "01" && mm <= "12" }

// widthsUpTo returns the widths of the groups that make up the first m
// digits.
func widthsUpTo(widths []uint8, m int) []uint8 {
	for k, n := 0, 0; k < len(widths); k++ {
		if n += int(widths[k]); n >= m {
			return widths[:k+1]
		}
	}
	return widths
}

// cardGrouping reports the ways cards are printed: whole, in fours (the
// last group of 3 or 4: 4-4-4-4-3 for 19 digits), 4-3-3-3 (13-digit
// Visa), or Amex's and Diners' 4-6-5 and 4-6-4.
func cardGrouping(w []uint8) bool {
	switch {
	case len(w) == 1:
		return true
	case len(w) == 3 && w[0] == 4 && w[1] == 6 && (w[2] == 5 || w[2] == 4):
		return true
	case len(w) == 4 && w[0] == 4 && w[1] == 3 && w[2] == 3 && w[3] == 3:
		return true
	}
	for k, x := range w {
		if x != 4 && (k < len(w)-1 || x < 3) {
			return false
		}
	}
	return true
}

func luhn(d []byte) bool {
	sum := 0
	for k := 0; k < len(d); k++ {
		v := int(d[len(d)-1-k])
		if k%2 == 1 {
			v *= 2
			if v > 9 {
				v -= 9
			}
		}
		sum += v
	}
	return sum%10 == 0
}

// issuer checks the leading digits against the major card networks: Visa
// 4; Mastercard 51–55, 2221–2720; Amex 34, 37; Discover 6011, 644–649, 65;
// Diners 300–305, 36, 38, 39; JCB 3528–3589; UnionPay 62; Maestro 50, 56–58, 67.
func issuer(d []byte) bool {
	p2 := int(d[0])*10 + int(d[1])
	p3 := p2*10 + int(d[2])
	p4 := p3*10 + int(d[3])
	switch {
	case d[0] == 4:
		return true
	case p2 >= 51 && p2 <= 55, p4 >= 2221 && p4 <= 2720:
		return true
	case p2 == 34 || p2 == 37:
		return len(d) == 15
	case p4 == 6011, p3 >= 644 && p3 <= 649, p2 == 65:
		return true
	case p3 >= 300 && p3 <= 305, p2 == 36, p2 == 38, p2 == 39:
		return true
	case p4 >= 3528 && p4 <= 3589:
		return true
	case p2 == 62, p2 == 50, p2 >= 56 && p2 <= 58, p2 == 67:
		return true
	}
	return false
}

// phone matches an international number (+ then 8–15 digits in groups
// separated by single spaces, dashes, dots or a parenthesised group) or a
// North American one written with separators: (AAA) EEE-NNNN,
// AAA-EEE-NNNN, AAA.EEE.NNNN, AAA EEE NNNN. Bare digit strings are not
// phone numbers here: too many other numbers look like them.
func phone(text string, i int) int {
	if text[i] == '+' {
		return intlPhone(text, i)
	}
	j := i
	spaces := false
	if text[j] == '(' {
		if j+5 > len(text) || !isDigit(text[j+1]) || !isDigit(text[j+2]) || !isDigit(text[j+3]) || text[j+4] != ')' {
			return 0
		}
		j += 5
		if j < len(text) && (text[j] == ' ' || text[j] == '-') {
			j++
		}
	} else {
		if j+4 > len(text) || digitRun(text, j) != j+3 || !phoneSep(text[j+3]) {
			return 0
		}
		spaces = text[j+3] == ' '
		j += 4
	}
	if j+8 > len(text) || digitRun(text, j) != j+3 || !phoneSep(text[j+3]) {
		return 0
	}
	spaces = spaces && text[j+3] == ' '
	if digitRun(text, j+4) != j+8 || !endsNumber(text, j+8) {
		return 0
	}
	// The area code begins with 2–9 under the North American plan: a
	// 1 or 0 there ("123-456-7890") is an id, not a number one can call.
	if area := text[i+1]; text[i] == '(' && area < '2' || text[i] != '(' && text[i] < '2' {
		return 0
	}
	if spaces && inList(text, i, j+8) {
		return 0
	}
	return j + 8
}

func phoneSep(c byte) bool { return c == '-' || c == '.' || c == ' ' }

func intlPhone(text string, i int) int {
	// A country code starts with 1–9, and a '+' after a digit and an
	// "e" is a float's exponent ("4.118e+00").
	if i+1 >= len(text) || text[i+1] < '1' || text[i+1] > '9' || i >= 2 && (text[i-1]|0x20) == 'e' && isDigit(text[i-2]) {
		return 0
	}
	j := i + 1
	n := 0
	end := 0
	for j < len(text) {
		c := text[j]
		switch {
		case isDigit(c):
			n++
			j++
			end = j
			continue
		case (c == ' ' || c == '-' || c == '.') && n > 0 && j+1 < len(text) && (isDigit(text[j+1]) || text[j+1] == '('):
			j++
			continue
		case c == '(' && n > 0 && j+2 < len(text) && isDigit(text[j+1]):
			k := digitRun(text, j+1)
			if k >= len(text) || text[k] != ')' || k-(j+1) > 4 {
				break
			}
			n += k - (j + 1)
			j = k + 1
			end = j
			if j < len(text) && (text[j] == ' ' || text[j] == '-') && j+1 < len(text) && isDigit(text[j+1]) {
				j++
			}
			continue
		}
		break
	}
	if n < 8 || n > 15 || end == 0 || !endsNumber(text, end) {
		return 0
	}
	return end
}

// atSign returns the length of the at sign at i: 1 for '@', 3 for
// "%40" (percent-encoded, as in a URL or a mailto link a model decodes at
// sight), 0 for none.
func atSign(text string, i int) int {
	switch {
	case text[i] == '@':
		return 1
	case i+2 < len(text) && text[i+1] == '4' && text[i+2] == '0': // '%' at i
		return 3
	}
	return 0
}

// dot returns the length of a label separator at k: 1 for '.', 3 for
// "%2E" or "%2e", 0 for none.
func dot(text string, k int) int {
	switch {
	case k >= len(text):
		return 0
	case text[k] == '.':
		return 1
	case text[k] == '%' && k+2 < len(text) && text[k+1] == '2' && (text[k+2] == 'E' || text[k+2] == 'e'):
		return 3
	}
	return 0
}

// email matches local@domain around the at sign of atLen bytes at at
// (see atSign): a local part of
// letters (any script), digits and ._%+- that does not start or end with a
// dot, and a domain of at least two labels of letters (any script), digits
// and inner dashes whose last is two or more letters or an A-label
// ("xn--p1ai"): internationalized addresses are addresses too.
func email(text string, from, at, atLen int) Match {
	start := at
	for start > from {
		r, n := utf8.DecodeLastRuneInString(text[from:start])
		if !isLocal(r) {
			break
		}
		start -= n
	}
	for start < at && text[start] == '.' {
		start++
	}
	if start == at || text[at-1] == '.' {
		return Match{}
	}
	end := at + atLen
	labels, lastStart := 0, end
	for {
		k := end
		for k < len(text) {
			r, n := utf8.DecodeRuneInString(text[k:])
			if r != '-' && !isLabel(r) {
				break
			}
			k += n
		}
		if k == end || text[end] == '-' || text[k-1] == '-' {
			break
		}
		labels++
		lastStart = end
		end = k
		if d := dot(text, k); d > 0 && k+d < len(text) && (isWord(text[k+d]) || text[k+d] >= utf8.RuneSelf) {
			end = k + d
			continue
		}
		break
	}
	if end > 0 && text[end-1] == '.' {
		end--
	}
	if labels < 2 || !topLevel(text[lastStart:end]) {
		return Match{}
	}
	return Match{Email, start, end}
}

// topLevel accepts a top-level domain: two or more letters of any script,
// or an A-label.
func topLevel(tld string) bool {
	if len(tld) > 4 && strings.EqualFold(tld[:4], "xn--") {
		return true
	}
	n := 0
	for _, r := range tld {
		if !unicode.IsLetter(r) {
			return false
		}
		n++
	}
	return n >= 2
}

func isLocal(r rune) bool {
	if r < utf8.RuneSelf {
		return isWord(byte(r)) || strings.IndexByte("._%+-", byte(r)) >= 0
	}
	return isLabel(r)
}

// isLabel: a character of a domain label other than '-'.
func isLabel(r rune) bool {
	if r < utf8.RuneSelf {
		return isDigit(byte(r)) || isAlpha(byte(r))
	}
	return unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r)
}
