# Fit a latency model to the benchmark sweep and print the summary.
library(stats)

d <- read.csv("inference_benchmark.csv")
d$tokens <- d$prompt_tokens + d$output_tokens
fit <- lm(ttft_ms_p50 ~ seq_len + batch, data = d)
print(summary(fit))

# Output:
#
# Call:
# lm(formula = ttft_ms_p50 ~ seq_len + batch, data = d)
#
# Residuals:
#     Min      1Q  Median      3Q     Max
# -212.04  -41.87   -3.12   38.95  301.66
#
# Coefficients:
#              Estimate Std. Error t value Pr(>|t|)
# (Intercept) 2.012e+01  4.118e+00   4.886 1.23e-06 ***
# seq_len     7.498e-02  9.021e-04  83.117  < 2e-16 ***
# batch       8.113e-01  3.876e-02  20.931  < 2e-16 ***
# ---
# Signif. codes:  0 '***' 0.001 '**' 0.01 '*' 0.05 '.' 0.1 ' ' 1
#
# Residual standard error: 67.89 on 409 degrees of freedom
# Multiple R-squared:  0.9456,	Adjusted R-squared:  0.9453
# F-statistic:  3556 on 2 and 409 DF,  p-value: < 2.2e-16

m <- matrix(c(123, 45, 6789, 512, 64, 2048, 128, 64, 1024), nrow = 3, byrow = TRUE)
print(m)
#      [,1] [,2] [,3]
# [1,]  123   45 6789
# [2,]  512   64 2048
# [3,]  128   64 1024
print(solve(m[, 1:2] %*% t(m[, 1:2])) * 1e6, digits = 4)
print(quantile(d$tokens_per_s, c(0.05, 0.25, 0.5, 0.75, 0.95)))
#      5%      25%      50%      75%      95%
#   123.4    612.9   1441.4   3134.8  10957.3
set.seed(20240305); sample(1:10000, 12)
#  [1] 4412 6789  123 9031 2045 7731 5521  882 3190 6404 1187  945
