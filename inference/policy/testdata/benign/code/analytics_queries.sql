-- Token usage per model and hour, from the gateway's usage table.
WITH hourly AS (
    SELECT model,
           date_trunc('hour', ts)                 AS hour,
           sum(prompt_tokens)                     AS prompt,
           sum(completion_tokens)                 AS completion,
           count(*)                               AS requests,
           percentile_disc(0.5)  WITHIN GROUP (ORDER BY duration_ms) AS p50_ms,
           percentile_disc(0.99) WITHIN GROUP (ORDER BY duration_ms) AS p99_ms
    FROM   usage_events
    WHERE  ts >= TIMESTAMP '2024-03-04 00:00:00' AND ts < TIMESTAMP '2024-03-05 00:00:00'
    GROUP  BY 1, 2
)
SELECT * FROM hourly WHERE requests > 100 ORDER BY hour, model LIMIT 50;

--        model         |        hour         |  prompt  | completion | requests | p50_ms | p99_ms
-- ---------------------+---------------------+----------+------------+----------+--------+--------
--  llama-3-8b-instruct | 2024-03-04 00:00:00 |  4182736 |     918274 |     3412 |   2231 |  19870
--  sql-lora            | 2024-03-04 00:00:00 |   512064 |      64128 |      961 |    804 |   6120
--  llama-3-8b-instruct | 2024-03-04 01:00:00 |  3901552 |     871023 |     3187 |   2198 |  20412
--  sql-lora            | 2024-03-04 01:00:00 |   498112 |      61877 |      937 |    812 |   5998
--  mistral-7b-instruct | 2024-03-04 01:00:00 |  1230456 |     345678 |     1024 |   1876 |  14001

-- Buckets of prompt length, powers of two.
SELECT width_bucket(log(2, greatest(prompt_tokens, 1)), 0, 15, 15) AS bucket,
       min(prompt_tokens), max(prompt_tokens), count(*)
FROM   usage_events
GROUP  BY 1 ORDER BY 1;

--  bucket | min  |  max  | count
-- --------+------+-------+--------
--       1 |    1 |     2 |    112
--       4 |    8 |    15 |   2048
--       7 |   64 |   127 |  40960
--       9 |  256 |   511 | 123450
--      10 |  512 |  1023 |  98304
--      11 | 1024 |  2047 |  65536
--      13 | 4096 |  8191 |   6789
--      15 |16384 | 32000 |    123

-- Daily cost in dollars at list price (per million tokens: 0.20 in, 0.60 out).
SELECT day, round(prompt * 0.20 / 1e6 + completion * 0.60 / 1e6, 2) AS usd
FROM   daily_usage
WHERE  day BETWEEN DATE '2024-02-01' AND DATE '2024-02-29';
