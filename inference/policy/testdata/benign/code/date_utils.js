'use strict';

const MS_PER_MINUTE = 60 * 1000;
const MS_PER_HOUR = 60 * MS_PER_MINUTE;
const MS_PER_DAY = 24 * MS_PER_HOUR;
const EPOCH_2024 = Date.UTC(2024, 0, 1); // 1704067200000

/** Parses "1h23m45s", "90s", "250ms", "2d" into milliseconds. */
function parseDuration(text) {
  const re = /(\d+(?:\.\d+)?)(ms|s|m|h|d)/g;
  const unit = { ms: 1, s: 1000, m: MS_PER_MINUTE, h: MS_PER_HOUR, d: MS_PER_DAY };
  let total = 0;
  let match;
  while ((match = re.exec(text)) !== null) {
    total += parseFloat(match[1]) * unit[match[2]];
  }
  return total;
}

/** ISO week number of a date (weeks start on Monday). */
function isoWeek(date) {
  const d = new Date(Date.UTC(date.getUTCFullYear(), date.getUTCMonth(), date.getUTCDate()));
  const day = d.getUTCDay() || 7;
  d.setUTCDate(d.getUTCDate() + 4 - day);
  const yearStart = Date.UTC(d.getUTCFullYear(), 0, 1);
  return Math.ceil(((d - yearStart) / MS_PER_DAY + 1) / 7);
}

function formatAll(ms) {
  const d = new Date(ms);
  return {
    iso: d.toISOString(),
    unix: Math.floor(ms / 1000),
    us: `${d.getUTCMonth() + 1}/${d.getUTCDate()}/${d.getUTCFullYear()}`,
    eu: `${String(d.getUTCDate()).padStart(2, '0')}.${String(d.getUTCMonth() + 1).padStart(2, '0')}.${d.getUTCFullYear()}`,
    week: `${d.getUTCFullYear()}-W${String(isoWeek(d)).padStart(2, '0')}`,
  };
}

module.exports = { parseDuration, isoWeek, formatAll, EPOCH_2024 };

// > parseDuration('1h23m45s')
// 5025000
// > parseDuration('250ms') + parseDuration('2d')
// 172800250
// > formatAll(1709648521000)
// { iso: '2024-03-05T14:22:01.000Z', unix: 1709648521, us: '3/5/2024', eu: '05.03.2024', week: '2024-W10' }
// > formatAll(EPOCH_2024 + 123 * MS_PER_DAY)
// { iso: '2024-05-03T00:00:00.000Z', unix: 1714694400, us: '5/3/2024', eu: '03.05.2024', week: '2024-W18' }
// > [2024, 1, 29].join('-'), new Date(2024, 1, 29).getDay()
// [ '2024-1-29', 4 ]
