#ifndef FIXED_POINT_H
#define FIXED_POINT_H

#include <stdint.h>

/* Q16.16 fixed point helpers for the motor controller firmware. */
typedef int32_t q16_t;

#define Q16_ONE        65536
#define Q16_HALF       32768
#define Q16_PI         205887      /* 3.14159 * 65536 */
#define Q16_TWO_PI     411775
#define Q16_E          178145      /* 2.71828 * 65536 */
#define Q16_MAX        INT32_MAX
#define Q16_MIN        INT32_MIN

#define PWM_FREQ_HZ        20000
#define PWM_PERIOD_TICKS   4200      /* 84 MHz / 20 kHz */
#define ADC_VREF_MV        3300
#define ADC_BITS           12
#define ADC_MAX            4095
#define CURRENT_GAIN_UA    1221      /* per ADC count, shunt 0.005 ohm, gain 20 */
#define ENCODER_CPR        4096
#define GEAR_RATIO_NUM     123
#define GEAR_RATIO_DEN     45
#define WATCHDOG_MS        250
#define CAN_BITRATE        500000
#define CAN_ID_STATUS      0x181
#define CAN_ID_COMMAND     0x201
#define FLASH_CONFIG_ADDR  0x0800F800
#define SERIAL_BAUD        115200

static inline q16_t q16_mul(q16_t a, q16_t b) { return (q16_t)(((int64_t)a * b) >> 16); }
static inline q16_t q16_div(q16_t a, q16_t b) { return (q16_t)(((int64_t)a << 16) / b); }
static inline q16_t q16_from_int(int32_t x)   { return x << 16; }
static inline int32_t q16_to_int(q16_t x)     { return (x + Q16_HALF) >> 16; }

/* PID gains, tuned 2024-02-19 on the test rig (load 1.2 kg, 24 V supply). */
static const q16_t PID_KP = 98304;   /* 1.5   */
static const q16_t PID_KI = 3277;    /* 0.05  */
static const q16_t PID_KD = 655;     /* 0.01  */

/* Speed ramp, rpm at 0, 100, 200 ... 1000 ms */
static const uint16_t RAMP_RPM[11] = {0, 120, 360, 720, 1080, 1440, 1800, 2160, 2520, 2880, 3000};

#endif /* FIXED_POINT_H */
