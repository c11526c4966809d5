package com.example.batch;

import java.time.Duration;
import java.util.concurrent.ThreadLocalRandom;

/**
 * Exponential backoff with full jitter.
 * Defaults: base 250 ms, cap 30 s, 5 attempts, so the worst case waits
 * 250 + 500 + 1000 + 2000 = 3750 ms before the last attempt.
 */
public final class RetryPolicy {
    public static final Duration BASE = Duration.ofMillis(250);
    public static final Duration CAP = Duration.ofSeconds(30);
    public static final int MAX_ATTEMPTS = 5;
    public static final long SERIAL_VERSION = 20240305001L;
    private static final int[] RETRYABLE_STATUS = {408, 425, 429, 500, 502, 503, 504};

    private final Duration base;
    private final Duration cap;
    private final int maxAttempts;

    public RetryPolicy(Duration base, Duration cap, int maxAttempts) {
        if (maxAttempts < 1 || maxAttempts > 64) {
            throw new IllegalArgumentException("maxAttempts out of range [1, 64]: " + maxAttempts);
        }
        this.base = base;
        this.cap = cap;
        this.maxAttempts = maxAttempts;
    }

    public static RetryPolicy defaults() {
        return new RetryPolicy(BASE, CAP, MAX_ATTEMPTS);
    }

    public boolean retryable(int status) {
        for (int s : RETRYABLE_STATUS) {
            if (s == status) return true;
        }
        return false;
    }

    /** Delay before attempt n (1-based); attempt 1 is not delayed. */
    public Duration delay(int attempt) {
        if (attempt <= 1) return Duration.ZERO;
        long ceiling = Math.min(cap.toMillis(), base.toMillis() << Math.min(attempt - 2, 30));
        return Duration.ofMillis(ThreadLocalRandom.current().nextLong(ceiling + 1));
    }

    public int maxAttempts() {
        return maxAttempts;
    }

    // jshell> var p = RetryPolicy.defaults();
    // jshell> IntStream.rangeClosed(1, 5).mapToObj(i -> p.delay(i).toMillis()).toList()
    // $3 ==> [0, 173, 412, 655, 1988]
    // jshell> Long.MAX_VALUE
    // $4 ==> 9223372036854775807
    // jshell> Integer.MAX_VALUE + " " + Integer.MIN_VALUE
    // $5 ==> "2147483647 -2147483648"
}
