//! Small geometry kernel for the tile renderer.

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Vec3 { pub x: f32, pub y: f32, pub z: f32 }

impl Vec3 {
    pub const ZERO: Vec3 = Vec3 { x: 0.0, y: 0.0, z: 0.0 };
    pub fn new(x: f32, y: f32, z: f32) -> Self { Vec3 { x, y, z } }
    pub fn dot(self, o: Vec3) -> f32 { self.x * o.x + self.y * o.y + self.z * o.z }
    pub fn cross(self, o: Vec3) -> Vec3 {
        Vec3::new(self.y * o.z - self.z * o.y, self.z * o.x - self.x * o.z, self.x * o.y - self.y * o.x)
    }
    pub fn length(self) -> f32 { self.dot(self).sqrt() }
}

/// Column-major 4x4 matrix.
pub type Mat4 = [[f32; 4]; 4];

pub const IDENTITY: Mat4 = [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]];

pub fn perspective(fov_y: f32, aspect: f32, near: f32, far: f32) -> Mat4 {
    let f = 1.0 / (fov_y / 2.0).tan();
    [
        [f / aspect, 0.0, 0.0, 0.0],
        [0.0, f, 0.0, 0.0],
        [0.0, 0.0, (far + near) / (near - far), -1.0],
        [0.0, 0.0, 2.0 * far * near / (near - far), 0.0],
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cross_product() {
        let a = Vec3::new(1.0, 2.0, 3.0);
        let b = Vec3::new(4.0, 5.0, 6.0);
        assert_eq!(a.cross(b), Vec3::new(-3.0, 6.0, -3.0));
        assert_eq!(a.dot(b), 32.0);
    }

    #[test]
    fn perspective_1920x1080() {
        let m = perspective(60f32.to_radians(), 1920.0 / 1080.0, 0.1, 1000.0);
        assert!((m[0][0] - 0.974_278_6).abs() < 1e-6);
        assert!((m[1][1] - 1.732_050_8).abs() < 1e-6);
        assert!((m[2][2] + 1.000_200_1).abs() < 1e-6);
        assert!((m[3][2] + 0.200_020_0).abs() < 1e-6);
    }

    #[test]
    fn tile_counts() {
        // 3840 x 2160 at 256-pixel tiles: 15 x 9 = 135 tiles (last row 112 px tall)
        let (w, h, t) = (3840u32, 2160u32, 256u32);
        assert_eq!(((w + t - 1) / t, (h + t - 1) / t), (15, 9));
        assert_eq!(h % t, 112);
    }
}
